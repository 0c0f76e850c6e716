package store

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
)

// A power cut loses what the disk had not flushed. These tests record
// every write bbolt makes to the store file, in order, then build the
// files a power cut could leave at each point of that log and open them
// the way a restart does.
//
// The model: bbolt writes a transaction's pages, fsyncs, writes the meta
// page that names them, and fsyncs again before the commit returns. So at
// a cut after write i, everything up to the last meta page whose fsync
// finished (a later write exists) is on disk; the writes after it, and
// that meta page itself when it is the last write, are each on disk or
// not, and one of them may be torn at a 512-byte sector.

// pageWrite is one write bbolt made to the store file.
type pageWrite struct {
	off  int64
	data []byte
	size int64 // the file's length just after it
}

// writeLog records the writes of one store.
type writeLog struct {
	mu     sync.Mutex
	writes []pageWrite
}

func (l *writeLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.writes)
}

// recordWrites puts a recorder in front of bbolt's page writes to d's file.
// It reaches into bbolt's unexported fields, which only a test may do; the
// test fails, rather than passing vacuously, if they move.
func recordWrites(t *testing.T, d *DB) *writeLog {
	t.Helper()
	db := reflect.ValueOf(d.db).Elem()
	fn, file := db.FieldByName("ops").FieldByName("writeAt"), db.FieldByName("file")
	require.True(t, fn.IsValid() && file.IsValid(), "bbolt's file and write function are no longer where this test looks")
	write := (*func([]byte, int64) (int, error))(unsafe.Pointer(fn.UnsafeAddr()))
	f := *(**os.File)(unsafe.Pointer(file.UnsafeAddr()))
	l := &writeLog{}
	orig := *write
	*write = func(b []byte, off int64) (int, error) {
		n, err := orig(b, off)
		fi, serr := f.Stat()
		if err == nil {
			err = serr
		}
		if err == nil {
			l.mu.Lock()
			l.writes = append(l.writes, pageWrite{off: off, data: bytes.Clone(b[:n]), size: fi.Size()})
			l.mu.Unlock()
		}
		return n, err
	}
	return l
}

// ackedCommit is a commit that returned: after a power cut at any point
// past its meta page's fsync, it must be in the store. A commit of a step,
// or (with tool set) a tool call's intent, or its result when done.
type ackedCommit struct {
	thread, id string
	tool       string
	done       bool
	writes     int // writes logged when it returned
}

func TestPowerCutKeepsEveryAckedCommit(t *testing.T) {
	points := 40
	if n, err := strconv.Atoi(os.Getenv("OUTPOST_POWERCUT_POINTS")); err == nil {
		points = n
	}
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	d, err := Open(path, Options{})
	require.NoError(t, err)
	pageSize := int64(d.db.Info().PageSize)
	base, err := os.ReadFile(path) // Open's own commits are fsynced
	require.NoError(t, err)
	log := recordWrites(t, d)

	// Concurrent threads, so commits share transactions: steps with small
	// and large blobs (overflow pages), tool calls' intents and results,
	// then a completed run, which appends to the outcome ledger.
	var mu sync.Mutex
	var acked []ackedCommit
	var wg sync.WaitGroup
	for th := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			thread := fmt.Sprintf("t%d", th)
			for i := 1; i <= 20; i++ {
				c := stepCommit(thread, i)
				if i%5 == 0 {
					big := bytes.Repeat([]byte(fmt.Sprintf("%s-%d ", thread, i)), 2000)
					c.Blobs[engine.RefOf(big)] = big
					c.Checkpoint.Channels = append(c.Checkpoint.Channels, engine.ChannelValue{Channel: "big", Value: engine.Value{Blob: engine.RefOf(big)}})
				}
				if i == 20 {
					c.Run.Status, c.Run.Output = engine.StatusCompleted, []byte(`{"final":"`+thread+`"}`)
				}
				if !assert.NoError(t, d.Commit(bg, c)) {
					return
				}
				mu.Lock()
				acked = append(acked, ackedCommit{thread: thread, id: c.Checkpoint.ID, writes: log.len()})
				mu.Unlock()
				if i%4 == 2 {
					// A tool call: its intent before it runs, its result after.
					key := fmt.Sprintf("run-%s:%d:task:0", thread, i)
					call := ToolCall{RunID: "run-" + thread, Tool: "lookup", ArgsHash: "h" + key}
					if !assert.NoError(t, d.PutToolIntent(bg, key, call)) {
						return
					}
					n := log.len()
					call.Result = engine.Value{Inline: []byte(`"ok"`)}
					if !assert.NoError(t, d.PutToolResult(bg, key, call)) {
						return
					}
					mu.Lock()
					acked = append(acked, ackedCommit{thread: thread, tool: key, writes: n},
						ackedCommit{thread: thread, tool: key, done: true, writes: log.len()})
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	// A prune deletes: pages are freed and rebalanced, and later commits
	// reuse them. It keeps each finished thread's last checkpoint.
	pruneFrom := log.len()
	rep, err := d.Prune(bg, 0, tc0.AddDate(10, 0, 0))
	require.NoError(t, err)
	require.Positive(t, rep.CheckpointsRemoved)
	for i := 1; i <= 10; i++ {
		require.NoError(t, d.Commit(bg, stepCommit("late", i)))
		acked = append(acked, ackedCommit{thread: "late", id: fmt.Sprintf("%04d", i), writes: log.len()})
	}
	require.NoError(t, d.Close())
	writes := log.writes
	isMeta := func(w pageWrite) bool { return w.off < 2*pageSize && int64(len(w.data)) == pageSize }
	metas := 0
	for _, w := range writes {
		if isMeta(w) {
			metas++
		}
	}
	t.Logf("%d writes, %d of them meta pages, %d commits", len(writes), metas, len(acked))
	require.Greater(t, metas, 10)

	rng := rand.New(rand.NewPCG(7, uint64(len(writes))))
	cuts := make([]int, 0, points)
	if points <= 0 || points >= len(writes) {
		for i := 1; i <= len(writes); i++ {
			cuts = append(cuts, i)
		}
	} else {
		for range points {
			cuts = append(cuts, 1+rng.IntN(len(writes)))
		}
	}
	img := filepath.Join(dir, "cut.db")
	for _, cut := range cuts {
		// durable: writes [0, durable) are on disk for sure.
		durable, lastMeta := 0, -1
		for i := range cut {
			if isMeta(writes[i]) {
				durable = i // its fsync came before this meta page
				lastMeta = i
			}
		}
		if lastMeta >= 0 && lastMeta < cut-1 {
			durable = lastMeta + 1 // a later write: the meta page's fsync finished
		}
		for variant := range 2 {
			file := bytes.Clone(base)
			if n := int(writes[cut-1].size); n > len(file) {
				file = append(file, make([]byte, n-len(file))...)
			}
			apply := func(w pageWrite, n int) { copy(file[w.off:], w.data[:n]) }
			for _, w := range writes[:durable] {
				apply(w, len(w.data))
			}
			torn := -1
			if variant == 1 && cut > durable {
				torn = durable + rng.IntN(cut-durable)
			}
			for i := durable; i < cut; i++ {
				w := writes[i]
				switch {
				case i == torn:
					apply(w, 512*rng.IntN(len(w.data)/512))
				case rng.IntN(2) == 0:
					apply(w, len(w.data))
				}
			}
			require.NoError(t, os.WriteFile(img, file, 0o600))
			name := fmt.Sprintf("cut after write %d of %d (durable %d, variant %d)", cut, len(writes), durable, variant)
			// Once the prune may be on disk, only a thread's last
			// checkpoint must be.
			must := func(a ackedCommit) bool {
				return a.writes <= durable && (durable <= pruneFrom || a.thread == "late" || a.id == "0020" || a.tool != "")
			}
			checkCutFile(t, img, name, acked, must)
			require.NoError(t, os.Remove(img))
			_ = os.Remove(LockFile(img))
		}
	}
}

// checkCutFile opens a file a power cut left as a restart would, and
// checks that it is sound, holds every acknowledged commit it must, and
// takes new commits.
func checkCutFile(t *testing.T, path, name string, acked []ackedCommit, must func(ackedCommit) bool) {
	t.Helper()
	d, err := Open(path, Options{})
	require.NoError(t, err, name)
	defer d.Close()
	rep, err := d.Check(bg)
	require.NoError(t, err, name)
	require.True(t, rep.OK(), "%s: %v", name, rep.Problems)
	for _, a := range acked {
		if !must(a) {
			continue
		}
		if a.tool != "" {
			tc, err := d.ToolCall(bg, a.tool)
			require.NoError(t, err, "%s: acked tool call %s", name, a.tool)
			require.NotNil(t, tc, "%s: acked tool call %s", name, a.tool)
			if a.done {
				require.Equal(t, ToolCallDone, tc.Status, "%s: acked tool result %s", name, a.tool)
			}
			continue
		}
		cp, err := d.Checkpoint(bg, a.thread, "", a.id)
		require.NoError(t, err, "%s: acked commit %s/%s", name, a.thread, a.id)
		require.NotNil(t, cp, "%s: acked commit %s/%s", name, a.thread, a.id)
	}
	// The free pages bbolt rebuilt at open hold nothing live: new commits
	// leave the store sound.
	for i := 1; i <= 3; i++ {
		c := stepCommit("after", i)
		big := bytes.Repeat([]byte{byte(i)}, 3*engine.BlobThreshold)
		c.Blobs[engine.RefOf(big)] = big
		require.NoError(t, d.Commit(bg, c), name)
	}
	rep, err = d.Check(bg)
	require.NoError(t, err, name)
	require.True(t, rep.OK(), "%s after new commits: %v", name, rep.Problems)
}
