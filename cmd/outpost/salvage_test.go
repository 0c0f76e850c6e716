package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/store"
	"github.com/outpost-edge/outpost/uplink"
)

// zeroRootPages clears the root pages that the meta pages of the store file
// at path name, as a cut or a bad sector takes them: no meta page leads to
// any bucket.
func zeroRootPages(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	le := binary.LittleEndian
	ps := int(le.Uint32(b[24:])) // the meta follows a 16-byte page header; its page size, 8 bytes in
	for _, meta := range []int{0, ps} {
		root := int(le.Uint64(b[meta+32:]))
		clear(b[root*ps : (root+1)*ps])
	}
	require.NoError(t, os.WriteFile(path, b, 0o600))
}

// upstream is an appliance's data folder whose outcomes a collector,
// running on loopback, holds.
type upstream struct {
	app, coll, url, mine string
	before               uplink.Status
	stop                 context.CancelFunc
	done                 chan int
}

// sentUpstream runs three turns, starts a collector and flushes the
// outcomes to it.
func sentUpstream(t *testing.T) *upstream {
	t.Helper()
	up := &upstream{app: t.TempDir(), coll: t.TempDir()}
	for _, input := range []string{"I forgot my metformin dose", "what is metformin for?", "I took two doses by mistake"} {
		code, _, errs := outpost(t, "run", "--data", up.app, input)
		require.Zero(t, code, errs)
	}
	code, out, errs := outpost(t, "uplink", "status", "--data", up.app, "--json")
	require.Zero(t, code, errs)
	require.NoError(t, json.Unmarshal([]byte(out), &up.before))
	secrets, mine := uplinkSecrets(t, t.TempDir(), up.coll, up.before.ApplianceID)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	up.mine, up.stop = mine, cancel
	up.url, _, up.done = startCollector(t, ctx, up.coll, secrets)
	code, _, errs = outpost(t, "uplink", "flush", "--data", up.app, "--url", up.url, "--secret-file", mine)
	require.Zero(t, code, errs)
	return up
}

// appliance stops the collector and returns what it holds of the
// appliance, the only one it must know.
func (up *upstream) appliance(t *testing.T) uplink.ApplianceStatus {
	t.Helper()
	up.stop()
	require.Zero(t, <-up.done)
	st, err := uplink.OpenBoltStore(up.coll)
	require.NoError(t, err)
	defer st.Close()
	list, err := st.Appliances(context.Background())
	require.NoError(t, err)
	require.Len(t, list, 1, "the collector sees another appliance")
	assert.Equal(t, up.before.ApplianceID, list[0].ApplianceID)
	return list[0]
}

// A store whose root page is lost, salvaged with the binary, keeps its
// appliance ID, and its ledger goes on upstream: the collector takes the
// outcomes run after the salvage as the same appliance's, its chain whole.
// Before, the copy got a new ID, salvage did not say so, and the flush was
// refused: the records carried the old ID, the batch the new one.
func TestSalvagedStoreGoesOnUpstream(t *testing.T) {
	up := sentUpstream(t)
	app, url, mine, before := up.app, up.url, up.mine, up.before

	db := filepath.Join(app, store.FileName)
	zeroRootPages(t, db)
	copied := filepath.Join(t.TempDir(), "salvaged.db")
	code, out, errs := outpostBin(t, "", "db", "salvage", "--data", app, copied)
	require.Equal(t, 1, code, out+errs) // the root page is lost
	assert.Contains(t, out, "the appliance ID was lost; the copy keeps "+before.ApplianceID+", the ID its outcomes carry\n")
	require.NoError(t, os.Rename(db, db+".damaged"))
	require.NoError(t, os.Rename(copied, db))

	code, out, errs = outpostBin(t, "", "uplink", "status", "--data", app, "--json")
	require.Zero(t, code, errs)
	var after uplink.Status
	require.NoError(t, json.Unmarshal([]byte(out), &after))
	assert.Equal(t, before.ApplianceID, after.ApplianceID)
	assert.Equal(t, before.LastSeq, after.LastSeq, "outcomes were lost")

	code, _, errs = outpost(t, "run", "--data", app, "--thread", "after-salvage", "I forgot my metformin dose again")
	require.Zero(t, code, errs)
	code, out, errs = outpostBin(t, "", "uplink", "flush", "--data", app, "--url", url, "--secret-file", mine)
	require.Zero(t, code, out+errs)
	assert.Contains(t, out, "backlog 0")

	got := up.appliance(t)
	assert.Equal(t, before.LastSeq+1, got.LastSeq)
	assert.Equal(t, "ok", got.Chain)
}

// conversation returns the encoded messages that thread's newest
// checkpoint holds, joined along its parent chain: the conversation the
// next turn sees.
func conversation(t *testing.T, data, thread string) []byte {
	t.Helper()
	d, err := store.Open(filepath.Join(data, store.FileName), store.Options{ReadOnly: true})
	require.NoError(t, err)
	defer d.Close()
	h, err := d.History(context.Background(), thread, "", "", 0)
	require.NoError(t, err)
	var all []byte
	for _, c := range h {
		for _, ch := range c.Channels {
			if ch.Channel != "messages" {
				continue
			}
			v := ch.Value.Inline
			if v == nil {
				v, err = d.Blob(context.Background(), ch.Value.Blob)
				require.NoError(t, err)
			}
			all = append(append(all, v...), '\n')
		}
	}
	return all
}

// A store whose root page is lost, salvaged with the binary, keeps each
// thread's conversation: salvage records the heads anew from the
// checkpoints it copies, so a new turn goes on from the thread's newest
// checkpoint, and db check of the copy is clean. Before, the heads were
// lost with the root page: the new turn started from an empty state, and
// db check named every copied checkpoint as one History does not list.
func TestSalvagedStoreKeepsTheConversation(t *testing.T) {
	app := t.TempDir()
	const first = "what does the guide say about storing insulin"
	// Enough turns that the checkpoints fill pages of their own, which
	// the root page only leads to.
	for i := range 12 {
		input := first
		if i > 0 {
			input = fmt.Sprintf("question %d: and how long does an open pen keep", i)
		}
		code, _, errs := outpost(t, "run", "--agent", "reference", "--data", app, "--thread", "t1", input)
		require.Zero(t, code, errs)
	}
	require.Contains(t, string(conversation(t, app, "t1")), first)
	code, out, errs := outpostBin(t, "", "runs", "history", "t1", "--data", app, "--json", "--limit", "1000")
	require.Zero(t, code, errs)
	var before struct{ Checkpoints []store.HistoryEntry }
	require.NoError(t, json.Unmarshal([]byte(out), &before))

	// Compacted, the store keeps no free page that holds an older root
	// page, and its heads with it: the heads are lost with the root.
	code, out, errs = outpostBin(t, "", "db", "compact", "--data", app)
	require.Zero(t, code, out+errs)
	db := filepath.Join(app, store.FileName)
	zeroRootPages(t, db)
	copied := filepath.Join(t.TempDir(), "salvaged.db")
	code, out, errs = outpostBin(t, "", "db", "salvage", "--data", app, "--json", copied)
	require.Equal(t, 1, code, out+errs) // the root page is lost
	var rep store.SalvageReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Equal(t, 1, rep.HeadsRebuilt)
	assert.Empty(t, rep.Check.Problems)
	require.NoError(t, os.Rename(db, db+".damaged"))
	require.NoError(t, os.Rename(copied, db))

	code, out, errs = outpostBin(t, "", "runs", "history", "t1", "--data", app, "--json", "--limit", "1")
	require.Zero(t, code, out+errs)
	var head struct{ Checkpoints []store.HistoryEntry }
	require.NoError(t, json.Unmarshal([]byte(out), &head))
	// The newest checkpoints wait in a bucket the root page holds inline,
	// and are lost with it: the head is the newest the copy holds.
	require.Len(t, head.Checkpoints, 1)
	last := head.Checkpoints[0]
	assert.Contains(t, before.Checkpoints, last, "the thread's head is none of its checkpoints")

	code, _, errs = outpostBin(t, "", "run", "--agent", "reference", "--data", app, "--thread", "t1", "and in the fridge")
	require.Zero(t, code, errs)
	code, out, errs = outpostBin(t, "", "runs", "history", "t1", "--data", app, "--json", "--limit", "1000")
	require.Zero(t, code, out+errs)
	var after struct{ Checkpoints []store.HistoryEntry }
	require.NoError(t, json.Unmarshal([]byte(out), &after))
	// The new turn's first checkpoint follows the thread's head of before.
	var cont bool
	for _, c := range after.Checkpoints {
		cont = cont || c.ParentID == last.ID && c.Step == last.Step+1
	}
	assert.True(t, cont, "the new turn did not go on from the thread's head %s", last.ID)
	conv := string(conversation(t, app, "t1"))
	assert.Contains(t, conv, first, "the new turn lost the conversation")
	assert.Contains(t, conv, "and in the fridge")

	code, out, errs = outpostBin(t, "", "db", "check", "--data", app)
	require.Zero(t, code, out+errs)
}

// A run that comes back unfinished from a store whose root page is lost is
// copied as failed with its outcome, and that outcome goes upstream: the
// collector takes it after the outcomes it holds, as the same appliance's,
// its chain whole. Before, the copy appended no outcome for such a run,
// and the collector never learned that it ended.
func TestSalvagedStoreSendsTheOutcomesOfTheRunsItFails(t *testing.T) {
	up := sentUpstream(t)
	app, url, mine, before := up.app, up.url, up.mine, up.before
	ctx := context.Background()

	// Runs that a crash cut short, each with its first step: enough of
	// them that their records fill a page of their own.
	db := filepath.Join(app, store.FileName)
	d, err := store.Open(db, store.Options{})
	require.NoError(t, err)
	for i := range 30 {
		thread := fmt.Sprintf("cut-%02d", i)
		id := fmt.Sprintf("%04d", i+1)
		require.NoError(t, d.Commit(ctx, &engine.Commit{Sync: true,
			Checkpoint: &engine.Checkpoint{Thread: thread, ID: id, Step: 1, Created: time.Now().UTC()},
			Run: &engine.Run{ID: "run-" + thread, Thread: thread, Agent: "medication-adherence", Status: engine.StatusRunning,
				Checkpoint: id, CreatedAt: time.Now().UTC()}}))
	}
	require.NoError(t, d.Close())

	zeroRootPages(t, db)
	copied := filepath.Join(t.TempDir(), "salvaged.db")
	code, out, errs := outpostBin(t, "", "db", "salvage", "--data", app, "--json", copied)
	require.Equal(t, 1, code, out+errs) // the root page is lost
	var rep store.SalvageReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, int(before.LastSeq), rep.Records["outcomes"], "outcomes the collector holds were lost: the copy's would fork its chain")
	assert.True(t, rep.Check.OK(), "%v", rep.Check.Problems)
	require.NoError(t, os.Rename(db, db+".damaged"))
	require.NoError(t, os.Rename(copied, db))
	d, err = store.Open(db, store.Options{ReadOnly: true})
	require.NoError(t, err)
	failed, err := d.Runs(ctx, engine.RunFilter{Status: engine.StatusFailed})
	require.NoError(t, err)
	require.NoError(t, d.Close())
	require.NotEmpty(t, failed, "no run came back to be copied as failed")

	code, out, errs = outpostBin(t, "", "uplink", "flush", "--data", app, "--url", url, "--secret-file", mine)
	require.Zero(t, code, out+errs)
	assert.Contains(t, out, "backlog 0")
	got := up.appliance(t)
	assert.Equal(t, before.LastSeq+uint64(len(failed)), got.LastSeq, "the collector did not get an outcome for each run copied as failed")
	assert.Equal(t, "ok", got.Chain)
}

// A checkpoint that fails its checksum is left out of a salvaged copy
// with its pending writes (here the interrupt of a turn that waits for a
// person), and salvage names each such write, in text and under --json.
// Before, the copy kept the write of the checkpoint it lost.
func TestSalvageLeavesOutTheWritesOfALostCheckpoint(t *testing.T) {
	dir := t.TempDir()
	code, _, errs := outpost(t, "run", "--data", dir, "--thread", "t1", "Can I take a double dose of metformin?")
	require.Zero(t, code, errs)
	path := filepath.Join(dir, store.FileName)
	var ckpt string
	var rec []byte
	bdb, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	require.NoError(t, err)
	require.NoError(t, bdb.View(func(tx *bbolt.Tx) error {
		k, _ := tx.Bucket([]byte("writes")).Cursor().First()
		require.NotNil(t, k, "the paused turn saved no pending write")
		parts := bytes.Split(k[:len(k)-9], []byte{0}) // thread, namespace, checkpoint ID
		require.Len(t, parts, 3)
		ckpt = string(parts[2])
		key := bytes.Join([][]byte{parts[2], parts[0], parts[1]}, []byte{0})
		for _, name := range []string{"recent", "checkpoints"} {
			if v := tx.Bucket([]byte(name)).Get(key); v != nil {
				rec = bytes.Clone(v)
			}
		}
		return nil
	}))
	require.NoError(t, bdb.Close())
	require.NotNil(t, rec)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for at := 0; ; { // every copy the file holds
		i := bytes.Index(b[at:], rec)
		if i < 0 {
			break
		}
		b[at+i+len(rec)/2] ^= 0xFF
		at += i + len(rec)
	}
	require.NoError(t, os.WriteFile(path, b, 0o600))

	code, out, errs := outpostBin(t, "", "db", "salvage", "--data", dir, filepath.Join(t.TempDir(), "salvaged.db"))
	require.Equal(t, 1, code, out+errs)
	assert.Contains(t, out, "1 pending write(s) of checkpoints the copy does not hold were left out")
	assert.Regexp(t, `LOST writes "t1\\x00\\x00`+ckpt+`\\x00"#\d+: a pending write of checkpoint `+ckpt+` \(thread "t1", namespace ""\), `+
		`which the copy does not hold: nothing can apply it, and it is left out\n`, out)
	assert.NotContains(t, out, "PROBLEM in the copy: writes")

	code, out, errs = outpostBin(t, "", "db", "salvage", "--data", dir, filepath.Join(t.TempDir(), "salvaged.db"), "--json")
	require.Equal(t, 1, code, out+errs)
	var rep struct {
		WritesLeftOut int             `json:"writes_left_out"`
		Lost          []store.Problem `json:"lost"`
		Check         struct {
			Problems []store.Problem `json:"problems"`
		} `json:"check"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	assert.Equal(t, 1, rep.WritesLeftOut)
	var named []store.Problem
	for _, p := range rep.Lost {
		if p.Bucket == "writes" {
			named = append(named, p)
		}
	}
	require.Len(t, named, 1, "%v", rep.Lost)
	assert.Contains(t, named[0].Message, "a pending write of checkpoint "+ckpt)
	for _, p := range rep.Check.Problems {
		assert.NotEqual(t, "writes", p.Bucket, "%v", p)
	}
}

// Two salvaged copies of one damaged store, served in turn from its data
// folder by the binary, number their events apart: the second copy's
// first event comes after every event the first gave a console client,
// though both copies came out of the same file with the same count. Before,
// both started from that count, and the second gave its events numbers
// the first had given others.
func TestTwoSalvagedCopiesServedInTurnNumberEventsApart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildOutpost(t)
	data := t.TempDir()
	code, _, errs := outpost(t, "run", "--data", data, "--thread", "t0", "I forgot my metformin dose")
	require.Zero(t, code, errs)
	db := filepath.Join(data, store.FileName)
	zeroRootPages(t, db)
	var copies []string
	for i := range 2 {
		dst := filepath.Join(t.TempDir(), fmt.Sprintf("salvaged-%d.db", i))
		code, out, errs := outpostBin(t, "", "db", "salvage", "--data", data, dst)
		require.Equal(t, 1, code, out+errs) // the root page is lost
		copies = append(copies, dst)
	}
	require.NoError(t, os.Rename(db, db+".damaged"))

	var last uint64
	for i, dst := range copies {
		if i > 0 {
			require.NoError(t, os.Rename(db, db+fmt.Sprintf(".copy-%d", i-1)))
		}
		require.NoError(t, os.Rename(dst, db))
		s := startServe(t, bin, data)
		code, body := s.call(t, "POST", fmt.Sprintf("/api/v1/threads/t%d/runs", i+1),
			`{"agent": "medication-adherence", "input": "I forgot my lisinopril dose", "wait": "20s"}`)
		require.Equal(t, 201, code, "%s", body)
		var run struct{ ID string }
		require.NoError(t, json.Unmarshal(body, &run))
		_, seqs := s.events(t, run.ID)
		require.NotEmpty(t, seqs)
		assert.Greater(t, seqs[0], last, "copy %d numbers an event as one served before it", i)
		last = seqs[len(seqs)-1]
		s.stop(t)
	}
}
