package uplink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
)

// Config configures an Uplink.
type Config struct {
	// URL is the collector's base URL; batches go to URL + /v1/outcomes.
	URL string
	// ApplianceID names this appliance upstream. Empty uses the store's;
	// another id is adopted by the store while its ledger is empty, and
	// refused after (store.ErrApplianceID).
	ApplianceID string
	// Secret is the HMAC-SHA256 key shared with the collector.
	Secret []byte
	// MaxRecords and MaxBytes bound a batch (defaults 500 and 1 MiB; a
	// record larger than MaxBytes goes alone).
	MaxRecords int
	MaxBytes   int
	// Redactor applies the bundle's redaction policy on the way out.
	// RedactorFor, when set, picks one per record's bundle instead. With
	// neither, only the identity fields (appliance_id, seq, outcome_id,
	// prev_hash, hash) leave in clear: what leaves is listed, never assumed.
	Redactor    Redactor
	RedactorFor func(engine.BundleRef) Redactor
	// Client sends the batches; nil uses one with Timeout.
	Client *http.Client
	// Timeout bounds one batch's round trip (default 30s).
	Timeout time.Duration
	// Poll is how often an idle uplink looks for new outcomes (default
	// 1s); Notify wakes it sooner.
	Poll time.Duration
	// MinBackoff and MaxBackoff shape the retry delays: full jitter over
	// MinBackoff·2^attempt, capped at MaxBackoff (defaults 500ms and 5m).
	MinBackoff, MaxBackoff time.Duration
	// ParkedRetry is how long a parked batch waits before Run tries it
	// again by itself (default 10m). Flush tries at once.
	ParkedRetry time.Duration
	// Events, when set, is told of each acknowledged batch
	// (engine.EventUplinkSent).
	Events engine.EventSink
}

func (c *Config) defaults() {
	if c.MaxRecords <= 0 {
		c.MaxRecords = 500
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = 1 << 20
	}
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	if c.Client == nil {
		c.Client = &http.Client{Timeout: c.Timeout, CheckRedirect: noRedirects}
	}
	if c.Poll <= 0 {
		c.Poll = time.Second
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = 500 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 5 * time.Minute
	}
	if c.ParkedRetry <= 0 {
		c.ParkedRetry = 10 * time.Minute
	}
}

// Status is what GET /api/v1/uplink and `outpost uplink status` show.
type Status struct {
	Configured    bool       `json:"configured"`
	ApplianceID   string     `json:"appliance_id"`
	URL           string     `json:"url,omitempty"`
	AckedSeq      uint64     `json:"acked_seq"`
	LastSeq       uint64     `json:"last_seq"`
	Backlog       uint64     `json:"backlog"`
	LastError     string     `json:"last_error,omitempty"`
	LastSuccessAt *time.Time `json:"last_success_at,omitempty"`
	// Parked is the batch the collector refused for good, if any.
	Parked *Parked `json:"parked,omitempty"`
	// NextAttemptAt is when a failed send is retried.
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	// ResendingFrom is set while the uplink sends again records the
	// collector had acknowledged and then lost (it answered a gap): from
	// that seq up to the cursor.
	ResendingFrom uint64 `json:"resending_from,omitempty"`
}

// Parked describes a refused batch. It stays in the ledger.
type Parked struct {
	FirstSeq   uint64    `json:"first_seq"`
	LastSeq    uint64    `json:"last_seq"`
	StatusCode int       `json:"status_code"`
	Code       string    `json:"code,omitempty"`
	Message    string    `json:"message"`
	At         time.Time `json:"at"`
}

// Uplink drains an appliance's outcome ledger to a collector, at least
// once and in seq order. It advances the store's cursor only when the
// collector answers 200 {"acked_seq"}.
type Uplink struct {
	db  *store.DB
	cfg Config

	send sync.Mutex // one batch in flight
	// resendFrom, when not 0, is where sending resumes below the cursor: the
	// collector lost records it had acknowledged (guarded by send).
	resendFrom uint64
	wake       chan struct{}
	mu         sync.Mutex
	st         Status // LastError, LastSuccessAt, Parked, NextAttemptAt
}

// New returns an uplink for db. Nothing is sent until Run or Flush.
func New(db *store.DB, cfg Config) (*Uplink, error) {
	cfg.defaults()
	if cfg.URL != "" {
		// A URL that cannot be sent to fails here, at once, not after
		// retries that cannot succeed.
		if err := CheckURL(cfg.URL); err != nil {
			return nil, fmt.Errorf("uplink: %w", err)
		}
	}
	if cfg.ApplianceID != "" {
		if err := db.SetApplianceID(context.Background(), cfg.ApplianceID); err != nil {
			return nil, fmt.Errorf("uplink: %w", err)
		}
	}
	u := &Uplink{db: db, cfg: cfg, wake: make(chan struct{}, 1)}
	u.st.Configured = cfg.URL != "" && len(cfg.Secret) > 0
	u.st.URL = cfg.URL
	return u, nil
}

// CheckURL reports a collector URL that batches cannot be sent to: one
// without an http or https scheme, or without a host.
func CheckURL(collector string) error {
	u, err := url.Parse(collector)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("collector URL %q: want http:// or https:// and a host, such as https://collector.site:8443", collector)
	}
	return nil
}

// Start makes an uplink and runs it in the background until ctx ends: the
// one call serve needs. A configuration without a URL runs nothing, but
// its Status still reports the backlog.
func Start(ctx context.Context, db *store.DB, cfg Config) (*Uplink, error) {
	u, err := New(db, cfg)
	if err != nil {
		return nil, err
	}
	if u.st.Configured {
		go func() { _ = u.Run(ctx) }()
	}
	return u, nil
}

// Notify wakes an idle Run to look for new outcomes now.
func (u *Uplink) Notify() {
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// Status reports the cursor, the backlog and the last attempt's result.
func (u *Uplink) Status() Status {
	u.mu.Lock()
	st := u.st
	u.mu.Unlock()
	st.ApplianceID = u.db.ApplianceID()
	if ls, err := u.db.Ledger(context.Background()); err == nil {
		st.AckedSeq, st.LastSeq, st.Backlog = ls.AckedSeq, ls.LastSeq, ls.Backlog()
	} else if st.LastError == "" {
		st.LastError = err.Error()
	}
	return st
}

// Run sends batches until ctx ends: at full speed while there is a
// backlog, polling when idle, backing off after failures, and waiting
// ParkedRetry (or a Flush) after a refusal. It returns ctx's error.
func (u *Uplink) Run(ctx context.Context) error {
	if !u.st.Configured {
		return ErrNotConfigured
	}
	attempt := 0
	for {
		n, err := u.sendBatch(ctx)
		var wait time.Duration
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil && n > 0:
			attempt = 0
			continue
		case err == nil:
			wait = u.cfg.Poll
		case errors.Is(err, ErrParked):
			attempt = 0
			wait = u.cfg.ParkedRetry
		case errors.Is(err, errResend):
			continue
		default:
			wait = u.backoff(attempt, err)
			attempt++
			at := time.Now().Add(wait)
			u.mu.Lock()
			u.st.NextAttemptAt = &at
			u.mu.Unlock()
		}
		// New outcomes cut an idle wait short, never a backoff or a park.
		var wake <-chan struct{}
		if err == nil {
			wake = u.wake
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		case <-wake:
			t.Stop()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// retryAfterError carries a collector's Retry-After.
type retryAfterError struct {
	error
	after time.Duration
}

func (e *retryAfterError) Unwrap() error { return e.error }

// backoff is full jitter over MinBackoff·2^attempt, capped, unless the
// collector said when to come back.
func (u *Uplink) backoff(attempt int, err error) time.Duration {
	var ra *retryAfterError
	if errors.As(err, &ra) && ra.after > 0 {
		return min(ra.after, time.Hour)
	}
	ceil := u.cfg.MaxBackoff
	if attempt < 40 {
		ceil = min(u.cfg.MinBackoff<<attempt, u.cfg.MaxBackoff)
	}
	return time.Duration(rand.Int64N(int64(ceil) + 1))
}

// Flush sends until the backlog is empty, retrying failures with backoff
// until ctx ends. A parked batch is tried once more; if it is refused
// again Flush returns an error wrapping ErrParked.
func (u *Uplink) Flush(ctx context.Context) error {
	if !u.st.Configured {
		return ErrNotConfigured
	}
	attempt := 0
	var lastErr error
	for {
		n, err := u.sendBatch(ctx)
		switch {
		case err == nil && n == 0:
			return nil
		case err == nil:
			attempt = 0
			continue
		case errors.Is(err, ErrParked):
			return err
		case errors.Is(err, errResend):
			continue
		case ctx.Err() != nil:
			if lastErr == nil {
				return err
			}
			return fmt.Errorf("flush: %w (last error: %v)", ctx.Err(), lastErr)
		}
		lastErr = err
		if !sleep(ctx, u.backoff(attempt, err)) {
			return fmt.Errorf("flush: %w (last error: %v)", ctx.Err(), err)
		}
		attempt++
	}
}

// sendBatch sends the next batch after the cursor, returning how many
// records the collector acknowledged (0 and nil: nothing to send).
func (u *Uplink) sendBatch(ctx context.Context) (int, error) {
	u.send.Lock()
	defer u.send.Unlock()
	ls, err := u.db.Ledger(ctx)
	if err != nil {
		return 0, u.failed(ctx, err)
	}
	after := ls.AckedSeq
	if u.resendFrom > 0 && u.resendFrom <= after {
		after = u.resendFrom - 1
	}
	if ls.LastSeq <= after {
		return 0, nil
	}
	recs, err := u.db.Outcomes(ctx, after, u.cfg.MaxRecords)
	if err != nil {
		return 0, u.failed(ctx, err)
	}
	// Redaction dominates the cost of a batch: encode its records on every
	// core.
	lines := make([][]byte, len(recs))
	err = parallel(len(recs), func(i int) error {
		r := u.cfg.Redactor
		if u.cfg.RedactorFor != nil {
			r = u.cfg.RedactorFor(recs[i].Bundle)
		}
		line, err := EncodeRecord(recs[i], r)
		if err != nil {
			return fmt.Errorf("encode outcome %d: %w", recs[i].Seq, err)
		}
		lines[i] = line
		return nil
	})
	if err != nil {
		return 0, u.failed(ctx, err)
	}
	var body bytes.Buffer
	n := 0
	for _, line := range lines {
		if n > 0 && body.Len()+len(line)+1 > u.cfg.MaxBytes {
			break
		}
		body.Write(line)
		body.WriteByte('\n')
		n++
	}
	recs = recs[:n]
	first, last := recs[0].Seq, recs[n-1].Seq
	appliance := ls.ApplianceID
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(u.cfg.URL, "/")+OutcomesPath, bytes.NewReader(body.Bytes()))
	if err != nil {
		return 0, u.failed(ctx, err)
	}
	req.Header.Set("Content-Type", ContentType)
	req.Header.Set(HeaderIdempotencyKey, IdempotencyKey(appliance, first, last))
	req.Header.Set(HeaderSignature, Sign(u.cfg.Secret, body.Bytes()))
	req.Header.Set(HeaderChainHead, recs[n-1].Hash)
	resp, err := u.cfg.Client.Do(req)
	if err != nil {
		return 0, u.failed(ctx, fmt.Errorf("send outcomes %d-%d: %w", first, last, err))
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, u.failed(ctx, fmt.Errorf("send outcomes %d-%d: read answer: %w", first, last, err))
	}
	if resp.StatusCode != http.StatusOK {
		se := &StatusError{StatusCode: resp.StatusCode, Message: quoteAnswer(answer)}
		if loc := resp.Header.Get("Location"); resp.StatusCode >= 300 && resp.StatusCode < 400 {
			se.Message = fmt.Sprintf("the collector redirects to %q, and outcomes go only to the URL configured: configure that URL if it is the collector's",
				quoteAnswer([]byte(loc)))
		}
		var e struct {
			Error struct {
				Code, Message string
				ExpectedSeq   uint64 `json:"expected_seq"`
			}
		}
		if json.Unmarshal(answer, &e) == nil && e.Error.Message != "" {
			se.Code, se.Message = e.Error.Code, e.Error.Message
		}
		err := fmt.Errorf("send outcomes %d-%d: %w", first, last, se)
		if retriable(resp.StatusCode) {
			return 0, u.failed(ctx, &retryAfterError{err, parseRetryAfter(resp.Header.Get("Retry-After"))})
		}
		if want := e.Error.ExpectedSeq; resp.StatusCode == http.StatusConflict && se.Code == CodeGap && want >= 1 && want < first {
			// The collector holds less than it acknowledged (restored
			// from a backup, say). The ledger still has every record:
			// send again from where the collector stands. A second gap
			// from there would park the batch.
			u.resendFrom = want
			u.mu.Lock()
			u.st.ResendingFrom = want
			u.mu.Unlock()
			return 0, u.failed(ctx, fmt.Errorf("%w: %w", errResend, err))
		}
		now := time.Now().UTC()
		u.mu.Lock()
		u.st.Parked = &Parked{FirstSeq: first, LastSeq: last, StatusCode: se.StatusCode, Code: se.Code, Message: se.Message, At: now}
		u.mu.Unlock()
		return 0, u.failed(ctx, fmt.Errorf("%w: %w", ErrParked, err))
	}
	var ack struct {
		AckedSeq *uint64 `json:"acked_seq"`
	}
	if err := json.Unmarshal(answer, &ack); err != nil || ack.AckedSeq == nil || *ack.AckedSeq < first || *ack.AckedSeq > last {
		return 0, u.failed(ctx, fmt.Errorf("send outcomes %d-%d: the collector's answer %q is not {\"acked_seq\"} within the batch", first, last, quoteAnswer(answer)))
	}
	if err := u.db.AckOutcomes(ctx, *ack.AckedSeq); err != nil {
		return 0, u.failed(ctx, err)
	}
	if u.resendFrom > 0 {
		u.resendFrom = *ack.AckedSeq + 1
		if u.resendFrom > ls.AckedSeq {
			u.resendFrom = 0 // caught up with the cursor
		}
	}
	now := time.Now().UTC()
	u.mu.Lock()
	u.st.LastError, u.st.LastSuccessAt, u.st.Parked, u.st.NextAttemptAt = "", &now, nil, nil
	u.st.ResendingFrom = u.resendFrom
	u.mu.Unlock()
	if u.cfg.Events != nil {
		ev := sentEvent(appliance, first, last, *ack.AckedSeq, n, body.Len())
		ev.Time = now
		u.cfg.Events.Publish(ev)
	}
	return int(*ack.AckedSeq - first + 1), nil
}

// noRedirects is the default client's redirect policy. Outcomes go only to
// the collector's URL as configured: a redirect would send them (and their
// signature) wherever it points, and one that turns the POST into a GET
// would leave the batch parked for no visible reason. The 3xx answer is
// reported as it is.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// failed records err as the last error, unless ctx has ended: an attempt
// cut short by a shutdown or a caller's deadline says nothing about the
// collector, and would hide the error that does (a 503, say).
func (u *Uplink) failed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	u.mu.Lock()
	u.st.LastError = err.Error()
	u.mu.Unlock()
	return err
}

// parallel runs fn(0..n-1) on up to GOMAXPROCS goroutines and returns the
// first error.
func parallel(n int, fn func(i int) error) error {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		for i := range n {
			if err := fn(i); err != nil {
				return err
			}
		}
		return nil
	}
	var next atomic.Int64
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := fn(i); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// maxQuoted bounds what of an answer that is not the collector's JSON
// (a captive portal's page, a proxy's error page) goes into the status.
const maxQuoted = 300

func quoteAnswer(answer []byte) string {
	s := strings.TrimSpace(string(answer))
	if len(s) <= maxQuoted {
		return s
	}
	// A rune cut in two at the end is dropped.
	return fmt.Sprintf("%s… (%d bytes in all)", strings.ToValidUTF8(s[:maxQuoted], ""), len(s))
}

// parseRetryAfter reads seconds or an HTTP date; 0 when absent or bad.
func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return time.Until(t)
	}
	return 0
}
