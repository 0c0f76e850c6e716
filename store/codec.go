package store

import (
	"errors"
	"fmt"
	"math"

	"github.com/outpost-edge/outpost/engine"
)

// Checkpoints and pending writes are written at every superstep, so they get
// hand-rolled binary codecs: no reflection, no field names, one allocation
// for the output buffer.

const (
	checkpointVersion = 1
	writeVersion      = 1
	headVersion       = 1
)

// Channel value flags.
const (
	cvDelta  = 1 << 0
	cvBlob   = 1 << 1
	cvInline = 1 << 2 // Inline is non-nil (it may still be empty)
	cvKnown  = cvDelta | cvBlob | cvInline
)

func encodeCheckpoint(c *engine.Checkpoint) []byte {
	size := len(c.Thread) + len(c.NS) + len(c.ID) + len(c.ParentID) + len(c.RunID) + len(c.Source) + 64
	for _, cv := range c.Channels {
		size += len(cv.Channel) + len(cv.Value.Inline) + 24
	}
	for _, t := range c.Next {
		size += len(t.ID) + len(t.Node) + len(t.Input) + 8
	}
	b := beginRecord(checkpointVersion, size)
	b = appendString(b, c.Thread)
	b = appendString(b, c.NS)
	b = appendString(b, c.ID)
	b = appendString(b, c.ParentID)
	b = appendString(b, c.RunID)
	b = binaryAppendVarint(b, int64(c.Step))
	b = appendString(b, c.Source)
	b = appendCount(b, len(c.Nodes), c.Nodes == nil)
	for _, n := range c.Nodes {
		b = appendString(b, n)
	}
	b = appendChannelValues(b, c.Channels)
	b = appendCount(b, len(c.Next), c.Next == nil)
	for _, t := range c.Next {
		b = appendString(b, t.ID)
		b = appendString(b, t.Node)
		b = appendBytesOpt(b, t.Input)
	}
	b = appendTime(b, c.Created)
	return seal(b)
}

func decodeCheckpoint(rec []byte) (*engine.Checkpoint, error) {
	payload, err := openRecord(rec, checkpointVersion)
	if err != nil {
		return nil, err
	}
	d := &decoder{b: payload}
	c := &engine.Checkpoint{
		Thread:   d.string(),
		NS:       d.string(),
		ID:       d.string(),
		ParentID: d.string(),
		RunID:    d.string(),
	}
	step := d.varint()
	c.Source = d.string()
	if n := d.count(); n >= 0 {
		c.Nodes = make([]string, n)
		for i := range c.Nodes {
			c.Nodes[i] = d.string()
		}
	}
	c.Channels = d.channelValues()
	if n := d.count(); n >= 0 {
		c.Next = make([]engine.TaskSpec, n)
		for i := range c.Next {
			c.Next[i] = engine.TaskSpec{ID: d.string(), Node: d.string(), Input: d.bytesOpt()}
		}
	}
	c.Created = d.time()
	if err := d.finish(); err != nil {
		return nil, err
	}
	c.Step = int(step)
	return c, nil
}

// decodeCheckpointLink reads only what a walk along parent links needs: a
// checkpoint's ID and its parent's. The checksum still covers the whole
// record.
func decodeCheckpointLink(rec []byte) (id, parentID string, err error) {
	payload, err := openRecord(rec, checkpointVersion)
	if err != nil {
		return "", "", err
	}
	d := &decoder{b: payload}
	d.raw(d.uvarint()) // thread
	d.raw(d.uvarint()) // namespace
	id, parentID = d.string(), d.string()
	if d.err != nil {
		return "", "", d.err
	}
	return id, parentID, nil
}

// A heads entry holds the ID of its namespace's newest checkpoint, sealed
// like every other record.
func encodeHead(id string) []byte {
	return seal(appendString(beginRecord(headVersion, len(id)+2), id))
}

func decodeHead(rec []byte) (string, error) {
	payload, err := openRecord(rec, headVersion)
	if err != nil {
		return "", err
	}
	d := &decoder{b: payload}
	id := d.string()
	if err := d.finish(); err != nil {
		return "", err
	}
	if id == "" {
		return "", errors.New("empty checkpoint ID")
	}
	return id, nil
}

func encodePendingWrite(w *engine.PendingWrite) []byte {
	size := len(w.TaskID) + len(w.Node) + len(w.Kind) + len(w.Data) + 16
	for _, cv := range w.Writes {
		size += len(cv.Channel) + len(cv.Value.Inline) + 24
	}
	b := beginRecord(writeVersion, size)
	b = appendString(b, w.TaskID)
	b = appendString(b, w.Node)
	b = appendString(b, w.Kind)
	b = appendChannelValues(b, w.Writes)
	b = appendBytesOpt(b, w.Data)
	return seal(b)
}

func decodePendingWrite(rec []byte) (*engine.PendingWrite, error) {
	payload, err := openRecord(rec, writeVersion)
	if err != nil {
		return nil, err
	}
	d := &decoder{b: payload}
	w := &engine.PendingWrite{TaskID: d.string(), Node: d.string(), Kind: d.string()}
	w.Writes = d.channelValues()
	if data := d.bytesOpt(); data != nil {
		w.Data = data
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	return w, nil
}

func appendChannelValues(b []byte, cvs []engine.ChannelValue) []byte {
	b = appendCount(b, len(cvs), cvs == nil)
	for _, cv := range cvs {
		b = appendString(b, cv.Channel)
		b = binaryAppendUvarint(b, cv.Version)
		var flags byte
		if cv.Delta {
			flags |= cvDelta
		}
		if !cv.Value.Blob.IsZero() {
			flags |= cvBlob
		}
		if cv.Value.Inline != nil {
			flags |= cvInline
		}
		b = append(b, flags)
		if flags&cvBlob != 0 {
			b = appendFixed64(b, cv.Value.Blob.Hash)
			b = binaryAppendUvarint(b, uint64(cv.Value.Blob.Len))
		}
		if flags&cvInline != 0 {
			b = binaryAppendUvarint(b, uint64(len(cv.Value.Inline)))
			b = append(b, cv.Value.Inline...)
		}
	}
	return b
}

func (d *decoder) channelValues() []engine.ChannelValue {
	n := d.count()
	if n < 0 {
		return nil
	}
	cvs := make([]engine.ChannelValue, n)
	for i := range cvs {
		cv := &cvs[i]
		cv.Channel = d.string()
		cv.Version = d.uvarint()
		flags := d.byte()
		if flags&^cvKnown != 0 {
			d.fail(fmt.Errorf("unknown channel value flags %#x", flags))
			return nil
		}
		cv.Delta = flags&cvDelta != 0
		if flags&cvBlob != 0 {
			cv.Value.Blob.Hash = d.fixed64()
			l := d.uvarint()
			if l > math.MaxUint32 {
				d.fail(errors.New("blob length out of range"))
				return nil
			}
			cv.Value.Blob.Len = uint32(l)
			if d.err == nil && cv.Value.Blob.IsZero() {
				d.fail(errors.New("blob flag with a zero reference"))
				return nil
			}
		}
		if flags&cvInline != 0 {
			v := d.raw(d.uvarint())
			cv.Value.Inline = append(make([]byte, 0, len(v)), v...)
		}
		if d.err != nil {
			return nil
		}
	}
	return cvs
}
