package uplink

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"time"

	"github.com/outpost-edge/outpost/internal/fsync"
	"go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// CollectorFileName is the bbolt collector store's file in its data folder.
const CollectorFileName = "collector.db"

// BoltStore is the collector's embedded store: one bbolt file. Records go
// in one bucket per appliance under "records", keyed by seq (8 bytes, big
// endian); heads in "appliances". Each value is a version byte, JSON and a
// CRC32C, like the appliance's own records.
type BoltStore struct {
	db *bbolt.DB
}

var _ CollectorStore = (*BoltStore)(nil)

const (
	boltAppliances = "appliances"
	boltRecords    = "records"
	boltVersion    = 1
)

// OpenBoltStore opens (creating it if needed) the store in dir. A second
// process on the same folder fails within a second.
func OpenBoltStore(dir string) (*BoltStore, error) {
	if err := fsync.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("collector store: %w", err)
	}
	db, err := bbolt.Open(filepath.Join(dir, CollectorFileName), 0o600, &bbolt.Options{Timeout: time.Second})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("collector store %s: in use by another process", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("collector store: %w", err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, b := range []string{boltAppliances, boltRecords} {
			if _, err := tx.CreateBucketIfNotExists([]byte(b)); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		// bbolt fsyncs the pages, not the name of a new file: without
		// this, a power cut could take away records already acknowledged
		// to their appliances, which never send them again. Every open
		// does it, in case the process that made the file stopped first.
		err = fsync.Dir(dir)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("collector store: %w", err)
	}
	return &BoltStore{db: db}, nil
}

// Close closes the file.
func (s *BoltStore) Close() error { return s.db.Close() }

type boltHead struct {
	LastSeq     uint64    `json:"last_seq"`
	LastHash    string    `json:"last_hash"`
	LastSeen    time.Time `json:"last_seen"`
	BrokenAtSeq uint64    `json:"broken_at_seq,omitempty"`
	Error       string    `json:"error,omitempty"`
}

type boltRecord struct {
	Hash     string `json:"hash"`
	PrevHash string `json:"prev_hash"`
	Line     []byte `json:"line"`
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func sealJSON(v any) ([]byte, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	b := append([]byte{boltVersion}, payload...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable)), nil
}

func openJSON(b []byte, v any) error {
	if len(b) < 5 {
		return errors.New("record is truncated")
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return errors.New("checksum mismatch")
	}
	if body[0] != boltVersion {
		return fmt.Errorf("record version %d, want %d", body[0], boltVersion)
	}
	return json.Unmarshal(body[1:], v)
}

func loadBoltHead(tx *bbolt.Tx, appliance string) (*boltHead, error) {
	h := &boltHead{}
	v := tx.Bucket([]byte(boltAppliances)).Get([]byte(appliance))
	if v == nil {
		return h, nil
	}
	if err := openJSON(v, h); err != nil {
		return nil, fmt.Errorf("appliance %s: corrupt head: %w", appliance, err)
	}
	return h, nil
}

func putBoltHead(tx *bbolt.Tx, appliance string, h *boltHead) error {
	v, err := sealJSON(h)
	if err != nil {
		return err
	}
	return tx.Bucket([]byte(boltAppliances)).Put([]byte(appliance), v)
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// Append implements CollectorStore.
func (s *BoltStore) Append(ctx context.Context, appliance string, batch []*Record, now time.Time) (Head, error) {
	var out Head
	err := s.db.Update(func(tx *bbolt.Tx) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := loadBoltHead(tx, appliance)
		if err != nil {
			return err
		}
		rb, err := tx.Bucket([]byte(boltRecords)).CreateBucketIfNotExists([]byte(appliance))
		if err != nil {
			return err
		}
		fresh, err := PlanAppend(Head{h.LastSeq, h.LastHash}, batch, func(seq uint64) (string, bool, error) {
			v := rb.Get(seqKey(seq))
			if v == nil {
				return "", false, nil
			}
			var r boltRecord
			if err := openJSON(v, &r); err != nil {
				return "", false, fmt.Errorf("appliance %s seq %d: corrupt record: %w", appliance, seq, err)
			}
			return r.Hash, true, nil
		})
		if err != nil {
			return err
		}
		for _, r := range fresh {
			v, err := sealJSON(boltRecord{Hash: r.Hash, PrevHash: r.PrevHash, Line: r.Line})
			if err != nil {
				return err
			}
			if err := rb.Put(seqKey(r.Seq), v); err != nil {
				return err
			}
			h.LastSeq, h.LastHash = r.Seq, r.Hash
		}
		if h.BrokenAtSeq != 0 && h.LastSeq >= h.BrokenAtSeq {
			h.BrokenAtSeq, h.Error = 0, ""
		}
		h.LastSeen = now.UTC()
		out = Head{h.LastSeq, h.LastHash}
		return putBoltHead(tx, appliance, h)
	})
	return out, err
}

// MarkBroken implements CollectorStore.
func (s *BoltStore) MarkBroken(ctx context.Context, appliance string, e *ChainError, now time.Time) error {
	return s.db.Update(func(tx *bbolt.Tx) error {
		h, err := loadBoltHead(tx, appliance)
		if err != nil {
			return err
		}
		h.BrokenAtSeq, h.Error, h.LastSeen = max(e.Seq, 1), e.Msg, now.UTC()
		return putBoltHead(tx, appliance, h)
	})
}

// Appliances implements CollectorStore.
func (s *BoltStore) Appliances(ctx context.Context) ([]ApplianceStatus, error) {
	var out []ApplianceStatus
	err := s.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte(boltAppliances)).ForEach(func(k, v []byte) error {
			var h boltHead
			if err := openJSON(v, &h); err != nil {
				return fmt.Errorf("appliance %s: corrupt head: %w", k, err)
			}
			out = append(out, statusOf(string(k), h.LastSeq, h.LastSeen, h.BrokenAtSeq, h.Error))
			return nil
		})
	})
	return out, err
}

func statusOf(id string, last uint64, seen time.Time, broken uint64, msg string) ApplianceStatus {
	st := ApplianceStatus{ApplianceID: id, LastSeq: last, LastSeen: seen.UTC(), Chain: "ok"}
	if broken != 0 {
		st.Chain, st.BrokenAtSeq, st.Error = "broken", broken, msg
	}
	return st
}

// Records implements CollectorStore.
func (s *BoltStore) Records(ctx context.Context, appliance string, after uint64, limit int) ([]*Record, error) {
	var out []*Record
	err := s.db.View(func(tx *bbolt.Tx) error {
		rb := tx.Bucket([]byte(boltRecords)).Bucket([]byte(appliance))
		if rb == nil {
			return nil
		}
		c := rb.Cursor()
		for k, v := c.Seek(seqKey(after + 1)); k != nil; k, v = c.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			var r boltRecord
			if err := openJSON(v, &r); err != nil {
				return fmt.Errorf("appliance %s seq %d: corrupt record: %w", appliance, binary.BigEndian.Uint64(k), err)
			}
			out = append(out, &Record{ApplianceID: appliance, Seq: binary.BigEndian.Uint64(k), Hash: r.Hash, PrevHash: r.PrevHash, Line: r.Line})
			if limit > 0 && len(out) == limit {
				break
			}
		}
		return nil
	})
	return out, err
}
