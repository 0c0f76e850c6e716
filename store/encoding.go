package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"
)

// Every record is sealed in the same envelope:
//
//	version (1 byte) | payload | CRC32C of version and payload (4 bytes, little endian)
//
// The version byte lets a later binary change a record's layout; the
// checksum catches torn or flipped bytes that bbolt's page checks do not.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const envelopeOverhead = 1 + 4

// Decoding errors. They are wrapped in a CorruptError by the caller, which
// knows the record's bucket and key.
var (
	errTruncated = errors.New("record is truncated")
	errChecksum  = errors.New("checksum mismatch")
	errTrailing  = errors.New("trailing bytes after record")
)

// beginRecord starts a record's buffer with its version byte; seal appends
// the checksum once the payload is written.
func beginRecord(version byte, sizeHint int) []byte {
	b := make([]byte, 1, 1+sizeHint+4)
	b[0] = version
	return b
}

func seal(b []byte) []byte {
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// openRecord checks a record's checksum and version and returns its
// payload, which aliases b.
func openRecord(b []byte, version byte) ([]byte, error) {
	if len(b) < envelopeOverhead {
		return nil, errTruncated
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, errChecksum
	}
	if body[0] != version {
		return nil, fmt.Errorf("record version %d, want %d", body[0], version)
	}
	return body[1:], nil
}

// Field encoding: strings and byte slices are uvarint-length-prefixed.
// Slices whose nil-ness matters are prefixed with n+1, where 0 means nil, so
// a record reads back exactly as it was written.

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytesOpt(b, v []byte) []byte {
	if v == nil {
		return append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(v))+1)
	return append(b, v...)
}

func appendCount(b []byte, n int, isNil bool) []byte {
	if isNil {
		return append(b, 0)
	}
	return binary.AppendUvarint(b, uint64(n)+1)
}

func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, 0)
	}
	b = append(b, 1)
	b = binary.AppendVarint(b, t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

// decoder reads fields in order. The first error sticks and every later
// read returns a zero value, so a decode function checks err once at the
// end. It never allocates more than the remaining input can justify.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.b = nil
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(errTruncated)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail(errTruncated)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 1 {
		d.fail(errTruncated)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) fixed64() uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.fail(errTruncated)
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

// raw returns the next n bytes, aliasing the input.
func (d *decoder) raw(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail(errTruncated)
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	return string(d.raw(d.uvarint()))
}

// bytesOpt reads a field written by appendBytesOpt into a fresh slice: the
// input belongs to a bbolt transaction and dies with it.
func (d *decoder) bytesOpt() []byte {
	n := d.uvarint()
	if d.err != nil || n == 0 {
		return nil
	}
	v := d.raw(n - 1)
	if d.err != nil {
		return nil
	}
	return append(make([]byte, 0, len(v)), v...)
}

// count reads a slice length written by appendCount; -1 means nil. Every
// element takes at least one byte, which bounds the length by the input.
func (d *decoder) count() int {
	n := d.uvarint()
	if d.err != nil || n == 0 {
		return -1
	}
	n--
	if n > uint64(len(d.b)) {
		d.fail(errTruncated)
		return -1
	}
	return int(n)
}

func (d *decoder) time() time.Time {
	switch d.byte() {
	case 0:
		return time.Time{}
	case 1:
	default:
		d.fail(errors.New("bad time tag"))
		return time.Time{}
	}
	sec := d.varint()
	nsec := d.uvarint()
	if d.err != nil {
		return time.Time{}
	}
	if nsec >= 1e9 {
		d.fail(errors.New("time nanoseconds out of range"))
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec)).UTC()
}

// finish reports the first error, or trailing bytes.
func (d *decoder) finish() error {
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return errTrailing
	}
	return nil
}

func beUint64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

func binaryAppendUvarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }
func binaryAppendVarint(b []byte, v int64) []byte   { return binary.AppendVarint(b, v) }
func appendFixed64(b []byte, v uint64) []byte       { return binary.BigEndian.AppendUint64(b, v) }
