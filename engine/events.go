package engine

import (
	"encoding/json"
	"sync"
	"time"
)

// Event types, as named in the events contract.
const (
	// EventRunStarted's data is {"agent","checkpoint"}: the input
	// checkpoint, with "committed": false when it is only a marker (exit
	// durability, as for EventCheckpoint).
	EventRunStarted  = "run.started"
	EventNodeStarted = "node.started"
	// EventNodeCompleted's data is {"task","writes","attempts"}: the
	// task's ID, the channels it wrote and how many attempts it took; with
	// "values": {channel: value} for the channels of RunConfig.EventValues
	// it wrote, each at its value after the step, while they take
	// EventValuesLimit bytes or less together; each channel past that is
	// named in "value_refs": {channel: "xxh64:<hash>:<bytes>"}, the ref of
	// the blob, stored with the step, that holds its value.
	EventNodeCompleted = "node.completed"
	EventModelToken    = "model.token"
	EventToolCalled    = "tool.called"
	EventToolResult    = "tool.result"
	EventToolDenied    = "tool.unauthorized"
	EventInterrupt     = "interrupt"
	EventRunResumed    = "run.resumed"
	// EventCheckpoint's data is {"id","step","next"} for a checkpoint that
	// is committed. In exit durability a step's checkpoint is only a marker
	// until the run commits at its end, an interrupt or an error, and then
	// only the newest is stored: the others' data adds "committed": false,
	// since their IDs name nothing a reader can load or fork from.
	EventCheckpoint      = "checkpoint"
	EventRunCompleted    = "run.completed"
	EventRunFailed       = "run.failed"
	EventBudgetExceeded  = "budget.exceeded"
	EventOutcomeAppended = "outcome.appended"
	EventUplinkSent      = "uplink.sent"
	// EventLost tells one subscriber how many events it missed because it
	// fell behind.
	EventLost = "events.lost"
)

// Event is one typed event. Committed events describe state that is already
// durable; Live events (model tokens, progress) describe work in progress and
// are never stored. Live is for subscribers in this process (a filter may
// leave such events out) and is not part of an event's JSON, whose shape is
// DESIGN's: seq, time, type, run, thread, node and data.
type Event struct {
	Seq    uint64          `json:"seq"`
	Time   time.Time       `json:"time"`
	Type   string          `json:"type"`
	Run    string          `json:"run"`
	Thread string          `json:"thread"`
	Node   string          `json:"node,omitempty"`
	Data   json.RawMessage `json:"data"`
	Live   bool            `json:"-"`
}

// EventSink receives events after their commit.
type EventSink interface {
	Publish(events ...Event)
}

// Bus fans events out to subscribers. Publish never blocks: a subscriber whose
// buffer is full loses events, and the next event it receives is an
// EventLost that says how many.
type Bus struct {
	mu     sync.Mutex
	seq    uint64
	subs   map[*Subscription]struct{}
	closed bool
}

// NewBus returns an empty bus.
func NewBus() *Bus { return &Bus{subs: map[*Subscription]struct{}{}} }

// Subscription is one subscriber's queue.
type Subscription struct {
	bus    *Bus
	filter func(Event) bool
	ch     chan Event
	lost   uint64
	done   bool
}

// C delivers the subscription's events, in publish order.
func (s *Subscription) C() <-chan Event { return s.ch }

// Close stops delivery and closes C.
func (s *Subscription) Close() {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	if !s.done {
		s.done = true
		delete(s.bus.subs, s)
		close(s.ch)
	}
}

// Subscribe returns a subscription with a buffer of size events that receives
// the events filter accepts (all when filter is nil).
func (b *Bus) Subscribe(size int, filter func(Event) bool) *Subscription {
	if size < 1 {
		size = 1
	}
	s := &Subscription{bus: b, filter: filter, ch: make(chan Event, size)}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		s.done = true
		close(s.ch)
		return s
	}
	b.subs[s] = struct{}{}
	return s
}

// StartAfter makes the next event's number after+1. An appliance calls it
// before the first event, with a number above every one an earlier life of
// the stream gave, so that a client resuming from an old number is told
// the window no longer reaches it, instead of being given the new life's
// events under numbers it has seen. Once events have flowed it does
// nothing: numbers never go back.
func (b *Bus) StartAfter(after uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq = max(b.seq, after)
}

// Seq returns the last sequence number assigned.
func (b *Bus) Seq() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seq
}

// Publish assigns sequence numbers and delivers events.
func (b *Bus) Publish(events ...Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range events {
		b.seq++
		e.Seq = b.seq
		if e.Time.IsZero() {
			e.Time = time.Now().UTC()
		}
		if e.Data == nil {
			e.Data = json.RawMessage("{}")
		}
		for s := range b.subs {
			if s.filter != nil && !s.filter(e) {
				continue
			}
			s.deliver(e)
		}
	}
}

// deliver is called with the bus locked.
func (s *Subscription) deliver(e Event) {
	if s.lost > 0 {
		// The notice takes the sequence number just below e's: every lost
		// event came before e, and no two events a subscriber receives
		// share a number (clients resume and deduplicate by seq).
		notice := Event{Seq: e.Seq - 1, Time: e.Time, Type: EventLost, Run: e.Run, Thread: e.Thread,
			Data: json.RawMessage(`{"lost":` + itoa(s.lost) + `}`)}
		select {
		case s.ch <- notice:
			s.lost = 0
		default:
			s.lost++
			return
		}
	}
	select {
	case s.ch <- e:
	default:
		s.lost++
	}
}

// Close closes every subscription.
func (b *Bus) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for s := range b.subs {
		s.done = true
		close(s.ch)
		delete(b.subs, s)
	}
}

func itoa(n uint64) string {
	var buf [20]byte
	i := len(buf)
	for {
		i--
		buf[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return string(buf[i:])
}
