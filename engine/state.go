package engine

import (
	"encoding/json"
	"fmt"
)

// State is a node's read-only view of the graph's channels.
type State interface {
	// Value returns a channel's current value.
	Value(channel string) (any, bool)
	// Input returns the task's own argument (a fan-out Send's Input), or nil.
	Input() any
	// Node names the node the view was given to ("" for routers).
	Node() string
	// Step is the superstep number.
	Step() int
}

// InputOf returns a fan-out task's input as T. After a restart the input comes
// back from its encoded form and is decoded into T here.
func InputOf[T any](s State) (T, error) {
	var zero T
	switch v := s.Input().(type) {
	case nil:
		return zero, fmt.Errorf("node %q: task has no input", s.Node())
	case T:
		return v, nil
	case json.RawMessage:
		var t T
		if err := json.Unmarshal(v, &t); err != nil {
			return zero, fmt.Errorf("node %q: decode task input: %w", s.Node(), err)
		}
		return t, nil
	default:
		return zero, fmt.Errorf("node %q: task input is %T, want %T", s.Node(), v, zero)
	}
}

// values is an immutable snapshot of channel values.
type values map[string]any

// view is the State given to nodes and routers.
type view struct {
	g     *Graph
	vals  values
	input any
	node  string
	step  int
}

func (v *view) Value(c string) (any, bool) {
	x, ok := v.vals[c]
	if ok && x != nil && v.g != nil {
		if spec := v.g.channels[c]; spec != nil && spec.clip != nil {
			x = spec.clip(x)
		}
	}
	return x, ok
}
func (v *view) Input() any   { return v.input }
func (v *view) Node() string { return v.node }
func (v *view) Step() int    { return v.step }
