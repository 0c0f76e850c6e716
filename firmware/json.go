package firmware

import (
	"errors"

	"github.com/outpost-edge/outpost/internal/strictjson"
)

// maxJSONDepth bounds nesting in the files a bundle holds.
const maxJSONDepth = strictjson.MaxDepth

// positions maps the JSON path of every object and array in a document
// ("nodes.2.config") to the byte offset where it starts (see
// strictjson.Positions).
type positions = strictjson.Positions

// decodeStrict decodes one JSON document into v the way every bundle file
// is read (see strictjson.Decode). Errors are *FileError values with the
// line and column.
func decodeStrict(file string, data []byte, v any) (positions, error) {
	return decodeStrictAt(file, data, 0, data, v)
}

// decodeStrictAt decodes sub, which sits at offset base of the file whole
// (a node's config inside a graph file), reporting positions in whole.
// Recorded positions are offsets in whole too.
func decodeStrictAt(file string, whole []byte, base int, sub []byte, v any) (positions, error) {
	return decodeStrictAs(ErrMalformed, file, whole, base, sub, v)
}

// decodeStrictAs is decodeStrictAt with the sentinel its errors wrap.
func decodeStrictAs(kind error, file string, whole []byte, base int, sub []byte, v any) (positions, error) {
	pos, err := strictjson.Decode(sub, v)
	if err != nil {
		off := -1
		var e *strictjson.Error
		if errors.As(err, &e) && e.Offset >= 0 {
			off = base + e.Offset
		}
		return nil, malformedAs(kind, file, whole, off, "", "%s", err.Error())
	}
	for k, off := range pos {
		pos[k] = base + off
	}
	return pos, nil
}

// lineCol renders a byte offset as a 1-based line and column (in bytes).
func lineCol(data []byte, off int) (int, int) { return strictjson.LineCol(data, off) }
