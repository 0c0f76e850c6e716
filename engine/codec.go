package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
)

// load materializes the state at checkpoint id ("" for the newest) and the
// pending writes saved against it.
func (e *execution) load(ctx context.Context, id string) error {
	head, err := e.store.Checkpoint(ctx, e.cfg.Thread, e.cfg.ns, id)
	if errors.Is(err, ErrCheckpointNotFound) && id == "" {
		e.vals, e.versions, e.sizes = values{}, map[string]uint64{}, map[string]int64{}
		return nil
	}
	if err != nil {
		return fmt.Errorf("load thread %q: %w", e.cfg.Thread, err)
	}
	observeID(head.ID)
	vals, versions, sizes, err := e.g.materialize(ctx, e.store, e.blobs, e.cfg.Cache, head)
	if err != nil {
		return err
	}
	e.vals, e.versions, e.sizes, e.head, e.committed = vals, versions, sizes, head, head.ID
	e.versionsShared, e.sizesShared, e.valsShared = true, true, true
	e.step = head.Step
	e.next = head.Next
	ws, err := e.store.Writes(ctx, e.cfg.Thread, e.cfg.ns, head.ID)
	if err != nil {
		return fmt.Errorf("load pending writes of %s: %w", head.ID, err)
	}
	e.writes = map[string][]PendingWrite{}
	for _, w := range ws {
		e.writes[w.TaskID] = append(e.writes[w.TaskID], w)
	}
	return nil
}

// pendingInterrupts lists the interrupts saved against the head that no
// later write of the same task has answered.
func (e *execution) pendingInterrupts() []PendingInterrupt {
	var out []PendingInterrupt
	for _, tid := range sortedKeys(e.writes) {
		ws := e.writes[tid]
		last := ws[len(ws)-1]
		if last.Kind != WriteKindInterrupt {
			continue
		}
		var ins []PendingInterrupt
		if err := json.Unmarshal(last.Data, &ins); err == nil {
			out = append(out, ins...)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// materialize folds the parent chain of head into channel values.
// It also returns each channel's encoded size (see cachedState.sizes).
func (g *Graph) materialize(ctx context.Context, store Checkpointer, blobs BlobStore, cache *StateCache, head *Checkpoint) (values, map[string]uint64, map[string]int64, error) {
	var chain []*Checkpoint
	var base *cachedState
	for c := head; ; {
		if cs := cache.get(c.Thread, c.NS, c.ID); cs != nil {
			base = cs
			break
		}
		chain = append(chain, c)
		if c.ParentID == "" {
			break
		}
		p, err := store.Checkpoint(ctx, c.Thread, c.NS, c.ParentID)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("load parent %s of checkpoint %s: %w", c.ParentID, c.ID, err)
		}
		c = p
	}
	if base != nil && len(chain) == 0 {
		// The maps are immutable once built: share them.
		return base.vals, base.versions, base.sizes, nil
	}
	vals, versions, sizes := values{}, map[string]uint64{}, map[string]int64{}
	if base != nil {
		for k, v := range base.vals {
			vals[k] = v
		}
		for k, v := range base.versions {
			versions[k] = v
		}
		for k, n := range base.sizes {
			sizes[k] = n
		}
	}
	for i := len(chain) - 1; i >= 0; i-- {
		c := chain[i]
		for _, cv := range c.Channels {
			spec := g.channels[cv.Channel]
			if spec == nil {
				return nil, nil, nil, fmt.Errorf("checkpoint %s holds channel %q, which graph %q does not declare", c.ID, cv.Channel, g.name)
			}
			v, err := decodeValue(ctx, blobs, spec, cv.Value)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("checkpoint %s channel %q: %w", c.ID, cv.Channel, err)
			}
			if cv.Delta && v != nil {
				vals[cv.Channel] = spec.reduce(vals[cv.Channel], v)
			} else {
				vals[cv.Channel] = v
			}
			addSize(sizes, cv)
			versions[cv.Channel] = cv.Version
		}
	}
	cache.put(head.Thread, head.NS, head.ID, vals, versions, sizes)
	return vals, versions, sizes, nil
}

func decodeValue(ctx context.Context, blobs BlobStore, spec *channelSpec, v Value) (any, error) {
	raw := v.Inline
	if !v.Blob.IsZero() {
		b, err := blobs.Blob(ctx, v.Blob)
		if err != nil {
			return nil, err
		}
		raw = b
	}
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	return spec.decode(raw)
}

// encode turns a value into inline bytes or a blob reference; blobs wait in
// blobBuf for the next commit.
func (e *execution) encode(spec *channelSpec, v any) (Value, error) {
	b, err := spec.encode(v)
	if err != nil {
		return Value{}, fmt.Errorf("encode channel %q: %w", spec.name, err)
	}
	if len(b) <= BlobThreshold {
		return Value{Inline: b}, nil
	}
	ref := RefOf(b)
	e.blobBuf[ref] = b
	return Value{Blob: ref}, nil
}

func (e *execution) markChanged(ch string) {
	if _, ok := e.changed[ch]; ok {
		return
	}
	spec := e.g.channels[ch]
	if spec.kind == KindAppend {
		e.changed[ch] = spec.length(e.vals[ch])
	} else {
		e.changed[ch] = 0
	}
}

// apply reduces writes (already validated) into a new snapshot of values.
func (e *execution) apply(writes []Write) {
	if len(writes) == 0 {
		return
	}
	// Copy on write, as bumpVersions does.
	nv := e.vals
	if e.valsShared || nv == nil {
		nv = make(values, len(e.vals)+len(writes))
		for k, v := range e.vals {
			nv[k] = v
		}
		e.valsShared = false
	}
	for _, w := range writes {
		e.markChanged(w.Channel)
		spec := e.g.channels[w.Channel]
		if spec.extend != nil && nv[w.Channel] != nil {
			nv[w.Channel] = spec.extend(nv[w.Channel], w.Value, e.owned[w.Channel])
			if e.owned == nil {
				e.owned = map[string]bool{}
			}
			e.owned[w.Channel] = true
			continue
		}
		nv[w.Channel] = spec.reduce(nv[w.Channel], w.Value)
	}
	e.vals = nv
	e.bumpVersions(writes)
}

func (e *execution) bumpVersions(writes []Write) {
	// Copy on write: the cache and results may share the map.
	nv := e.versions
	if e.versionsShared || nv == nil {
		nv = make(map[string]uint64, len(e.versions)+1)
		for k, v := range e.versions {
			nv[k] = v
		}
		e.versionsShared = false
	}
	for i, w := range writes {
		seen := false
		for _, p := range writes[:i] {
			if p.Channel == w.Channel {
				seen = true
				break
			}
		}
		if !seen {
			nv[w.Channel]++
		}
	}
	e.versions = nv
}

func (e *execution) checkWrites(node string, ws []Write) error {
	for _, w := range ws {
		spec := e.g.channels[w.Channel]
		if spec == nil {
			return MarkPermanent(fmt.Errorf("%w %q", ErrUnknownChannel, w.Channel))
		}
		if w.Value == nil || !spec.check(w.Value) {
			return MarkPermanent(fmt.Errorf("%w: channel %q got %T", ErrWrongType, w.Channel, w.Value))
		}
	}
	return nil
}

// newCheckpoint records the changes since the last commit as a checkpoint.
// In exit durability, intermediate checkpoints are only markers: their
// channels are encoded once, when the run commits (see uncommitted).
func (e *execution) newCheckpoint(source string, nodes []string) (*Checkpoint, error) {
	c := &Checkpoint{
		Thread: e.cfg.Thread, NS: e.cfg.ns, ID: e.newCheckpointID(e.committed), ParentID: e.committed, RunID: e.run.ID,
		Step: e.step, Source: source, Nodes: nodes, Next: e.next, Created: e.cfg.now().UTC(),
	}
	if !e.commitsEachStep() {
		return c, nil
	}
	return c, e.encodeChanges(c)
}

// encodeChanges fills c.Channels with the channels changed since the last
// commit.
func (e *execution) encodeChanges(c *Checkpoint) error {
	c.Channels = c.Channels[:0]
	for _, ch := range sortedKeys(e.changed) {
		spec := e.g.channels[ch]
		v := e.vals[ch]
		// Append channels store only the items added since the last
		// commit, so a long thread costs storage in proportion to its length.
		delta := spec.kind == KindAppend
		if delta {
			v = spec.tail(v, min(e.changed[ch], spec.length(v)))
		}
		enc, err := e.encode(spec, v)
		if err != nil {
			return err
		}
		c.Channels = append(c.Channels, ChannelValue{Channel: ch, Version: e.versions[ch], Delta: delta, Value: enc})
	}
	return nil
}

// newCheckpointID is the id of the checkpoint that follows parent in the
// execution's namespace.
func (e *execution) newCheckpointID(parent string) string {
	if e.cfg.IDs != nil {
		if id := e.cfg.IDs(e.cfg.ns, parent); id != "" {
			observeID(id) // so that an id the engine makes next is greater
			return id
		}
	}
	return newID()
}
