package firmware

import (
	"encoding/json"
	"fmt"
	"slices"
)

// raised is what a graph's nodes can write to its channels as flags: a
// guardrail, a review, a model node with flag_risks and a tool loop add
// flags of a fixed vocabulary to the graph's flags channel, and say which when they
// are built (Env.raise). Where anything else may be written to a channel
// (the run's input, a node whose config names the channel, a node of a Go
// program's own kind), what it holds is not known, and the reason is kept.
// verify checks a golden conversation's expected flags against it.
type raised struct {
	flags   map[string][]string // by channel
	unknown map[string]string   // by channel, or anyChannel: why it is not known
}

// anyChannel stands for every channel, in raised.unknown.
const anyChannel = "*"

func (r *raised) add(channel string, flags ...string) {
	if r.flags == nil {
		r.flags = map[string][]string{}
	}
	for _, f := range flags {
		if !slices.Contains(r.flags[channel], f) {
			r.flags[channel] = append(r.flags[channel], f)
		}
	}
}

// opaque records that channel may hold what the graph cannot tell, and
// why; the first reason is kept.
func (r *raised) opaque(channel, why string) {
	if r.unknown == nil {
		r.unknown = map[string]string{}
	}
	if _, ok := r.unknown[channel]; !ok {
		r.unknown[channel] = why
	}
}

// can returns the flags the graph can write to channel, sorted, or why
// that is not known.
func (r *raised) can(channel string) (flags []string, why string) {
	if r == nil {
		return nil, "the graph was not compiled"
	}
	if why, ok := r.unknown[anyChannel]; ok {
		return nil, why
	}
	if why, ok := r.unknown[channel]; ok {
		return nil, why
	}
	flags = slices.Clone(r.flags[channel])
	slices.Sort(flags)
	return flags, ""
}

// include adds what subgraph node, running sub, writes to the channels
// the graph shares with it: those of the same name that the graph
// declares (see engine.Builder.AddSubgraph).
func (r *raised) include(node string, sub *raised, declared map[string]Channel) {
	for ch, why := range sub.unknown {
		if _, ok := declared[ch]; ok || ch == anyChannel {
			r.opaque(ch, fmt.Sprintf("subgraph node %q: %s", node, why))
		}
	}
	for ch, flags := range sub.flags {
		if _, ok := declared[ch]; ok {
			r.add(ch, flags...)
		}
	}
}

// namedChannels lists the channels of declared that a node's config
// names in any of its strings: the node may write to them, so what they
// hold is not the flags alone.
func namedChannels(cfg json.RawMessage, declared map[string]Channel) []string {
	var v any
	if len(cfg) == 0 || json.Unmarshal(cfg, &v) != nil {
		return nil
	}
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			if _, ok := declared[v]; ok && !slices.Contains(out, v) {
				out = append(out, v)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		case map[string]any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(v)
	return out
}
