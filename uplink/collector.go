package uplink

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outpost-edge/outpost/store"
)

// MaxBatchBytes is the largest body a collector accepts.
const MaxBatchBytes = 32 << 20

// CollectorStore keeps what a collector received: each (appliance, seq)
// once, and each appliance's chain head. BoltStore and PostgresStore
// implement it; one conformance suite (collectorstore_test.go) runs on both.
type CollectorStore interface {
	// Append stores a batch of one appliance's records, verified one by
	// one and in order, atomically: it locks the appliance's chain, calls
	// PlanAppend with its head and stored hashes, and stores what the plan
	// says, or nothing when PlanAppend fails. It returns the head after.
	Append(ctx context.Context, appliance string, batch []*Record, now time.Time) (Head, error)
	// MarkBroken records that a signed batch was refused for breaking the
	// chain (a fork, a bad link or an altered record).
	MarkBroken(ctx context.Context, appliance string, e *ChainError, now time.Time) error
	// Appliances lists every appliance heard from, by id.
	Appliances(ctx context.Context) ([]ApplianceStatus, error)
	// Records returns an appliance's stored records with seq > after, in
	// order, at most limit (0: all).
	Records(ctx context.Context, appliance string, after uint64, limit int) ([]*Record, error)
	Close() error
}

// Head is where an appliance's chain stands at the collector.
type Head struct {
	LastSeq  uint64
	LastHash string
}

// ApplianceStatus is one entry of GET /v1/appliances.
type ApplianceStatus struct {
	ApplianceID string    `json:"appliance_id"`
	LastSeq     uint64    `json:"last_seq"`
	LastSeen    time.Time `json:"last_seen"`
	// Chain is "ok", or "broken" once a batch the appliance signed showed
	// a fork, a bad link or an altered record, until the chain grows past
	// it. A batch refused for anything else (a bad signature, an unknown
	// appliance, a malformed body, a gap) changes nothing.
	Chain       string `json:"chain"`
	BrokenAtSeq uint64 `json:"broken_at_seq,omitempty"`
	Error       string `json:"error,omitempty"`
}

// PlanAppend decides what of batch (consecutive seqs, each verified against
// its own hash and linked to the one before) extends a chain at head.
// Records already held must match the stored hash (hashOf); the first new
// one must follow head exactly. It returns the records to store.
func PlanAppend(head Head, batch []*Record, hashOf func(seq uint64) (string, bool, error)) ([]*Record, error) {
	var fresh []*Record
	for _, r := range batch {
		if r.Seq > head.LastSeq {
			fresh = append(fresh, r)
			continue
		}
		h, ok, err := hashOf(r.Seq)
		if err != nil {
			return nil, err
		}
		if !ok || h != r.Hash {
			return nil, &ChainError{Code: CodeFork, Seq: r.Seq,
				Msg: fmt.Sprintf("seq %d differs from the record already stored for it: the appliance's chain forked", r.Seq)}
		}
	}
	if len(fresh) == 0 {
		return nil, nil
	}
	first := fresh[0]
	switch {
	case first.Seq > head.LastSeq+1:
		return nil, &ChainError{Code: CodeGap, Seq: first.Seq, Expected: head.LastSeq + 1,
			Msg: fmt.Sprintf("gap: the collector holds up to seq %d, the batch starts at %d", head.LastSeq, first.Seq)}
	case head.LastSeq == 0 && first.PrevHash != store.GenesisHash,
		head.LastSeq > 0 && first.PrevHash != head.LastHash:
		return nil, &ChainError{Code: CodeBadLink, Seq: first.Seq,
			Msg: fmt.Sprintf("bad link: seq %d's prev_hash %.12s… is not the hash %.12s… of seq %d", first.Seq, first.PrevHash, head.LastHash, head.LastSeq)}
	}
	return fresh, nil
}

// unknownSecret stands in for the secret of an appliance the collector
// does not know, whose batch is verified all the same.
var unknownSecret [32]byte

// Collector is the receiving end of uplinks: an http.Handler serving
// POST /v1/outcomes and GET /v1/appliances.
type Collector struct {
	store   CollectorStore
	secrets map[string][]byte
	token   string
	log     *slog.Logger
	mux     *http.ServeMux
	now     func() time.Time

	// appliances serializes batches per appliance within this process
	// (the store's lock does so across processes).
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// CollectorOptions configure NewCollector.
type CollectorOptions struct {
	// Secrets maps each appliance id to its shared HMAC secret.
	Secrets map[string][]byte
	// Logger reports refused batches; nil uses slog.Default.
	Logger *slog.Logger
	// Token is the bearer token GET /v1/appliances asks for: the list
	// names every appliance and how far its chain reaches. Empty answers
	// the list to no one.
	Token string
}

// NewCollector returns a collector storing into st.
func NewCollector(st CollectorStore, opts CollectorOptions) *Collector {
	c := &Collector{store: st, secrets: opts.Secrets, token: opts.Token, log: opts.Logger, now: time.Now, locks: map[string]*sync.Mutex{}}
	if c.log == nil {
		c.log = slog.Default()
	}
	// The methods are checked here rather than in the mux's patterns, whose
	// 405 (like its 404) is plain text: every answer is in the API's
	// error shape.
	c.mux = http.NewServeMux()
	c.mux.HandleFunc(OutcomesPath, only(c.receive, http.MethodPost))
	c.mux.HandleFunc(AppliancesPath, only(c.appliances, http.MethodGet, http.MethodHead))
	c.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no such path %q: a collector serves POST %s and GET %s", r.URL.Path, OutcomesPath, AppliancesPath))
	})
	return c
}

// only serves h for the methods given and answers others 405, naming them.
func only(h http.HandlerFunc, methods ...string) http.HandlerFunc {
	allow := strings.Join(methods, ", ")
	return func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(methods, r.Method) {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s %s: this path takes %s", r.Method, r.URL.Path, allow))
			return
		}
		h(w, r)
	}
}

func (c *Collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p := r.URL.Path; p != path.Clean(p) {
		// The mux would redirect a path like //v1/outcomes to its clean
		// form, with an HTML page, and a client that follows it turns a
		// POST into a GET: a collector's paths are exact.
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no such path %q: a collector serves POST %s and GET %s", p, OutcomesPath, AppliancesPath))
		return
	}
	c.mux.ServeHTTP(w, r)
}

func (c *Collector) lock(appliance string) func() {
	c.mu.Lock()
	l := c.locks[appliance]
	if l == nil {
		l = &sync.Mutex{}
		c.locks[appliance] = l
	}
	c.mu.Unlock()
	l.Lock()
	return l.Unlock
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

func (c *Collector) receive(w http.ResponseWriter, r *http.Request) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != ContentType {
		writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type",
			fmt.Sprintf("a batch is %s, not %q", ContentType, r.Header.Get("Content-Type")))
		return
	}
	appliance, first, last, err := parseIdempotencyKey(r.Header.Get(HeaderIdempotencyKey))
	if err != nil {
		writeError(w, http.StatusBadRequest, "malformed", err.Error())
		return
	}
	// The body is read, and its size checked, before the appliance is
	// looked up, and an unknown appliance is answered as a bad signature
	// is: no answer tells which appliance ids the collector knows.
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBatchBytes+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "malformed", "read body: "+err.Error())
		return
	}
	if len(body) > MaxBatchBytes {
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("a batch holds at most %d bytes", MaxBatchBytes))
		return
	}
	secret, known := c.secrets[appliance]
	if !known {
		// Verified all the same, so that the answer takes as long.
		secret = unknownSecret[:]
	}
	if !verifySignature(secret, body, r.Header.Get(HeaderSignature)) || !known {
		cause := ErrSignature
		if !known {
			cause = ErrUnknownAppliance
		}
		c.log.Warn("collector: batch refused", "appliance", appliance, "batch", r.Header.Get(HeaderIdempotencyKey), "err", cause)
		writeError(w, http.StatusUnauthorized, "unauthorized",
			"the batch's "+HeaderSignature+" does not verify for the appliance its "+HeaderIdempotencyKey+
				" names: the collector does not list that appliance id, or holds another secret for it")
		return
	}
	batch, err := parseBatch(body, appliance, first, last, r.Header.Get(HeaderChainHead))
	var ce *ChainError
	switch {
	case errors.As(err, &ce):
		c.refuse(r.Context(), w, appliance, ce)
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, "malformed", err.Error())
		return
	}
	unlock := c.lock(appliance)
	head, err := c.store.Append(r.Context(), appliance, batch, c.now())
	unlock()
	switch {
	case errors.As(err, &ce):
		c.refuse(r.Context(), w, appliance, ce)
		return
	case err != nil:
		c.log.Error("collector: store batch", "appliance", appliance, "batch", r.Header.Get(HeaderIdempotencyKey), "err", err)
		writeError(w, http.StatusServiceUnavailable, "store", err.Error())
		return
	}
	_ = head
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]uint64{"acked_seq": last})
}

// refuse answers a signed batch that does not extend the chain. A fork, a
// bad link or an altered record is the appliance's own signed evidence of
// a break, and is recorded; a gap is not: it says the collector lacks
// records (it was restored from an older backup, or an old batch came
// again), which the appliance sends again from the seq asked for.
func (c *Collector) refuse(ctx context.Context, w http.ResponseWriter, appliance string, ce *ChainError) {
	c.log.Warn("collector: batch refused", "appliance", appliance, "code", ce.Code, "seq", ce.Seq, "err", ce.Msg)
	if ce.Code != CodeGap {
		if err := c.store.MarkBroken(ctx, appliance, ce, c.now()); err != nil {
			c.log.Error("collector: record broken chain", "appliance", appliance, "err", err)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ce.HTTPStatus())
	e := map[string]any{"code": ce.Code, "message": ce.Msg, "seq": ce.Seq}
	if ce.Expected > 0 {
		e["expected_seq"] = ce.Expected
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"error": e})
}

// authorized reports whether r carries the collector's bearer token.
func (c *Collector) authorized(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || c.token == "" {
		return false
	}
	// Hashing first makes the comparison's time independent of the
	// lengths too.
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(c.token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// parseBatch decodes and verifies a batch on its own: every line a record
// of the appliance matching its hash, seqs consecutive from first to last,
// each linked to the one before, the last one's hash the chain head.
func parseBatch(body []byte, appliance string, first, last uint64, chainHead string) ([]*Record, error) {
	var lines [][]byte
	for line := range bytes.SplitSeq(body, []byte("\n")) {
		if len(bytes.TrimSpace(line)) > 0 {
			lines = append(lines, line)
		}
	}
	// Verifying each record's hash is the collector's main cost: do it on
	// every core, then check the order and links in sequence.
	out := make([]*Record, len(lines))
	err := parallel(len(lines), func(i int) error {
		rec, err := DecodeRecord(lines[i])
		if err != nil {
			return fmt.Errorf("line %d: %w", i+1, err)
		}
		out[i] = rec
		return nil
	})
	if err != nil {
		// Report the first failing line, whichever worker found it.
		for i, line := range lines {
			if _, lerr := DecodeRecord(line); lerr != nil {
				return nil, fmt.Errorf("line %d: %w", i+1, lerr)
			}
		}
		return nil, err
	}
	for i, rec := range out {
		if rec.ApplianceID != appliance {
			return nil, fmt.Errorf("%w: line %d is of appliance %q, the batch of %q", ErrMalformed, i+1, rec.ApplianceID, appliance)
		}
		if want := first + uint64(i); rec.Seq != want {
			return nil, fmt.Errorf("%w: line %d holds seq %d, want %d", ErrMalformed, i+1, rec.Seq, want)
		}
		if i > 0 && rec.PrevHash != out[i-1].Hash {
			return nil, &ChainError{Code: CodeBadLink, Seq: rec.Seq,
				Msg: fmt.Sprintf("bad link: seq %d's prev_hash is not the hash of seq %d", rec.Seq, rec.Seq-1)}
		}
	}
	if len(out) == 0 || out[len(out)-1].Seq != last {
		return nil, fmt.Errorf("%w: the body does not hold seqs %d to %d", ErrMalformed, first, last)
	}
	if chainHead != out[len(out)-1].Hash {
		return nil, fmt.Errorf("%w: %s is not the last record's hash", ErrMalformed, HeaderChainHead)
	}
	return out, nil
}

func (c *Collector) appliances(w http.ResponseWriter, r *http.Request) {
	if !c.authorized(r) {
		w.Header().Set("WWW-Authenticate", "Bearer")
		writeError(w, http.StatusUnauthorized, "unauthorized",
			"GET "+AppliancesPath+" needs the collector's token: Authorization: Bearer <token>")
		return
	}
	list, err := c.store.Appliances(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "store", err.Error())
		return
	}
	if list == nil {
		list = []ApplianceStatus{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"appliances": list})
}

// LoadSecrets reads a collector's secrets file: one "appliance_id secret"
// pair a line; blank lines and lines starting with # are skipped.
func LoadSecrets(path string) (map[string][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read secrets: %w", err)
	}
	out := map[string][]byte{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("secrets %s line %d: want \"appliance_id secret\"", path, i+1)
		}
		if _, dup := out[f[0]]; dup {
			return nil, fmt.Errorf("secrets %s line %d: appliance %q is listed twice", path, i+1, f[0])
		}
		out[f[0]] = []byte(f[1])
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("secrets %s: no appliance listed", path)
	}
	return out, nil
}

// LoadSecret reads an appliance's own secret file: the secret alone.
func LoadSecret(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read uplink secret: %w", err)
	}
	s := strings.TrimSpace(string(data))
	if s == "" || strings.ContainsAny(s, " \t\n") {
		return nil, fmt.Errorf("uplink secret %s: want the secret alone on one line", path)
	}
	return []byte(s), nil
}
