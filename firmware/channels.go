package firmware

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/models"
)

// Channel types of declarative graphs.
const (
	TypeString   = "string"   // Go string
	TypeStrings  = "strings"  // []string
	TypeMessages = "messages" // []models.Message
	TypeDocs     = "docs"     // []firmware.Doc
	TypeJSON     = "json"     // any (merge: map[string]any)
	TypeInt      = "int"      // int
	TypeFloat    = "float"    // float64
)

// Channel is a channel declared by a graph file.
type Channel struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Reducer string `json:"reducer"`
}

// Doc is a knowledge-base document, and the item type of docs channels.
type Doc struct {
	ID    string  `json:"id"`
	Title string  `json:"title,omitempty"`
	Text  string  `json:"text"`
	Score float64 `json:"score,omitempty"`
}

// declare adds c to b with the Go type its type and reducer call for, and
// returns the typed handle (an engine.Chan) that nodes built on package
// agent need.
func declare(b *engine.Builder, c Channel) (any, error) {
	switch c.Type + "/" + c.Reducer {
	case "string/replace":
		return engine.Replace[string](b, c.Name), nil
	case "strings/replace":
		return engine.Replace[[]string](b, c.Name), nil
	case "strings/append":
		return engine.Append[string](b, c.Name), nil
	case "messages/replace":
		return engine.Replace[[]models.Message](b, c.Name), nil
	case "messages/append":
		return engine.Append[models.Message](b, c.Name), nil
	case "docs/replace":
		return engine.Replace[[]Doc](b, c.Name), nil
	case "docs/append":
		return engine.Append[Doc](b, c.Name), nil
	case "json/replace":
		return engine.Replace[any](b, c.Name), nil
	case "json/append":
		return engine.Append[any](b, c.Name), nil
	case "json/merge":
		return engine.Merge[string, any](b, c.Name), nil
	case "int/replace":
		return engine.Replace[int](b, c.Name), nil
	case "int/sum":
		return engine.Sum[int](b, c.Name), nil
	case "float/replace":
		return engine.Replace[float64](b, c.Name), nil
	case "float/sum":
		return engine.Sum[float64](b, c.Name), nil
	}
	return nil, fmt.Errorf("channel %q: type %q with reducer %q is not supported (types: string, strings, messages, docs, json, int, float; reducers: replace, append for lists, merge for json, sum for numbers)", c.Name, c.Type, c.Reducer)
}

// zeroWrite returns the write that empties a replace channel at the start
// of a turn.
func (c Channel) zeroWrite() (engine.Write, error) {
	if c.Reducer != engine.KindReplace {
		return engine.Write{}, fmt.Errorf("channel %q has reducer %s: only replace channels can be reset", c.Name, c.Reducer)
	}
	w := engine.Write{Channel: c.Name}
	switch c.Type {
	case TypeString:
		w.Value = ""
	case TypeStrings:
		w.Value = []string{}
	case TypeMessages:
		w.Value = []models.Message{}
	case TypeDocs:
		w.Value = []Doc{}
	case TypeJSON:
		w.Value = nil
	case TypeInt:
		w.Value = 0
	case TypeFloat:
		w.Value = 0.0
	}
	return w, nil
}

// isList reports whether values of c are lists that a fan-out can iterate.
func (c Channel) isList() bool {
	switch c.Type {
	case TypeStrings, TypeMessages, TypeDocs:
		return true
	case TypeJSON:
		return c.Reducer == engine.KindAppend || c.Reducer == engine.KindReplace
	}
	return false
}

// textWrite returns a write of text to c, in c's type: a string is set, a
// list gets one more item (or becomes that item, for replace), a messages
// channel gets an assistant message.
func (c Channel) textWrite(text string) (engine.Write, error) {
	w := engine.Write{Channel: c.Name}
	switch c.Type {
	case TypeString:
		w.Value = text
	case TypeStrings:
		w.Value = []string{text}
	case TypeMessages:
		w.Value = []models.Message{{Role: models.RoleAssistant, Content: text}}
	case TypeJSON:
		if c.Reducer == engine.KindMerge {
			return w, fmt.Errorf("channel %q (json, merge) cannot hold text", c.Name)
		}
		if c.Reducer == engine.KindAppend {
			w.Value = []any{text}
		} else {
			w.Value = any(text)
		}
	default:
		return w, fmt.Errorf("channel %q (%s) cannot hold text", c.Name, c.Type)
	}
	return w, nil
}

// canHoldText reports whether textWrite succeeds for c.
func (c Channel) canHoldText() error {
	_, err := c.textWrite("")
	return err
}

// inputWrite maps a request's JSON input to a write on c: a JSON string
// becomes text (a user message for messages channels); other JSON is taken
// as the channel's own value.
func (c Channel) inputWrite(raw json.RawMessage) (engine.Write, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if c.Type == TypeMessages {
			return engine.Write{Channel: c.Name, Value: []models.Message{{Role: models.RoleUser, Content: s}}}, nil
		}
		return c.textWrite(s)
	}
	w := engine.Write{Channel: c.Name}
	var err error
	switch c.Type {
	case TypeString:
		err = fmt.Errorf("channel %q takes a JSON string", c.Name)
	case TypeStrings:
		var v []string
		err = json.Unmarshal(raw, &v)
		w.Value = v
	case TypeMessages:
		var v []models.Message
		err = json.Unmarshal(raw, &v)
		w.Value = v
	case TypeDocs:
		var v []Doc
		err = json.Unmarshal(raw, &v)
		w.Value = v
	case TypeInt:
		var v int
		err = json.Unmarshal(raw, &v)
		w.Value = v
	case TypeFloat:
		var v float64
		err = json.Unmarshal(raw, &v)
		w.Value = v
	case TypeJSON:
		switch c.Reducer {
		case engine.KindMerge:
			var v map[string]any
			err = json.Unmarshal(raw, &v)
			w.Value = v
		case engine.KindAppend:
			var v []any
			err = json.Unmarshal(raw, &v)
			w.Value = v
		default:
			var v any
			err = json.Unmarshal(raw, &v)
			w.Value = v
		}
	}
	return w, err
}

// isEmpty reports whether a channel value counts as empty: unset, "", an
// empty list or map, or zero.
func isEmpty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return strings.TrimSpace(x) == ""
	case []string:
		return len(x) == 0
	case []models.Message:
		return len(x) == 0
	case []Doc:
		return len(x) == 0
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	case int:
		return x == 0
	case float64:
		return x == 0
	}
	return false
}

// items returns the elements of a list value, for a fan-out.
func items(v any) []any {
	var out []any
	switch x := v.(type) {
	case []string:
		for _, e := range x {
			out = append(out, e)
		}
	case []models.Message:
		for _, e := range x {
			out = append(out, e)
		}
	case []Doc:
		for _, e := range x {
			out = append(out, e)
		}
	case []any:
		out = append(out, x...)
	}
	return out
}

// number reads an int or float channel value.
func number(v any) float64 {
	switch x := v.(type) {
	case int:
		return float64(x)
	case float64:
		return x
	}
	return 0
}

// render turns a value into the text a template shows: strings as they
// are, lists one item a line, documents as "[id] text", messages by their
// last content, numbers in decimal, anything else as compact JSON.
func render(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case json.RawMessage:
		var d any
		if json.Unmarshal(x, &d) == nil {
			return render(d)
		}
		return string(x)
	case []string:
		return strings.Join(x, "\n")
	case []models.Message:
		if len(x) == 0 {
			return ""
		}
		return x[len(x)-1].Content
	case Doc:
		return "[" + x.ID + "] " + strings.TrimSpace(x.Text)
	case []Doc:
		lines := make([]string, len(x))
		for i, d := range x {
			lines[i] = render(d)
		}
		return strings.Join(lines, "\n")
	case int:
		return strconv.Itoa(x)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case map[string]any:
		raw, _ := json.Marshal(x) // sorts the keys
		return string(raw)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(raw)
}

// docIDs lists the ids of a docs value.
func docIDs(v any) []string {
	ds, _ := v.([]Doc)
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.ID
	}
	return ids
}

// hasFlag reports whether the flags channel holds flag.
func hasFlag(s engine.State, flagsCh, flag string) bool {
	v, _ := s.Value(flagsCh)
	fs, _ := v.([]string)
	for _, f := range fs {
		if f == flag {
			return true
		}
	}
	return false
}
