package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/store"
)

// storeWithRun makes a data folder holding one finished run of seven
// checkpoints, with its outcome.
func storeWithRun(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	code, _, stderr := outpost(t, "run", "--data", dir, "--thread", "t1", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	return dir
}

// eachRunRecord calls fn with the key of every run record of the store in
// dir, which no process has open, in one write transaction.
func eachRunRecord(t *testing.T, dir string, fn func(tx *bbolt.Tx, key []byte) error) {
	t.Helper()
	bdb, err := bbolt.Open(filepath.Join(dir, store.FileName), 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		var keys [][]byte
		_ = tx.Bucket([]byte("runs")).ForEach(func(k, _ []byte) error {
			if !strings.HasSuffix(string(k), "\x00o") { // not an outcome index entry
				keys = append(keys, append([]byte(nil), k...))
			}
			return nil
		})
		for _, k := range keys {
			if err := fn(tx, k); err != nil {
				return err
			}
		}
		return nil
	}))
	require.NoError(t, bdb.Close())
}

// damageRunRecords flips a byte in the middle of every run record, so that
// each fails its checksum while bbolt's pages stay whole.
func damageRunRecords(t *testing.T, dir string) {
	t.Helper()
	eachRunRecord(t, dir, func(tx *bbolt.Tx, k []byte) error {
		b := tx.Bucket([]byte("runs"))
		v := append([]byte(nil), b.Get(k)...)
		v[len(v)/2] ^= 0xff
		return b.Put(k, v)
	})
}

// markUnfinished records every run of the store in dir as running in its
// index of unfinished runs, as if a crash had stopped them: recovery at
// start reads them.
func markUnfinished(t *testing.T, dir string) {
	t.Helper()
	eachRunRecord(t, dir, func(tx *bbolt.Tx, k []byte) error {
		return tx.Bucket([]byte("unfinished")).Put(k, []byte("running"))
	})
}

// folderFiles maps each file of dir to its bytes.
func folderFiles(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	files := map[string][]byte{}
	for _, e := range entries {
		if e.Type().IsRegular() {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			require.NoError(t, err)
			files[e.Name()] = b
		}
	}
	return files
}

// A check only reads: neither a sound store nor one with a damaged record
// changes by a byte (opening for writing would commit a transaction and
// replace the older meta page, a damaged store's one fallback), and no
// file appears beside it. A file outside a data folder is checked with
// --file, read-only too.
func TestDBCheckWritesNothing(t *testing.T) {
	sound := storeWithRun(t)
	damaged := storeWithRun(t)
	damageRunRecords(t, damaged)
	for _, tc := range []struct {
		name string
		dir  string
		code int
		out  string
	}{
		{"sound", sound, 0, "store is sound"},
		{"damaged record", damaged, 1, "PROBLEM runs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, os.Remove(filepath.Join(tc.dir, store.LockFile(store.FileName))))
			before := folderFiles(t, tc.dir)
			for _, args := range [][]string{{"db", "check", "--data", tc.dir}, {"db", "check", "--data", tc.dir, "--json"},
				{"db", "check", "--file", filepath.Join(tc.dir, store.FileName)}} {
				code, stdout, stderr := outpost(t, args...)
				require.Equal(t, tc.code, code, stdout+stderr)
				if !strings.Contains(strings.Join(args, " "), "--json") {
					require.Contains(t, stdout, tc.out)
				}
				after := folderFiles(t, tc.dir)
				require.Equal(t, before[store.FileName], after[store.FileName], "db check wrote to the store: %v", args)
				require.Equal(t, before, after, "db check changed the data folder: %v", args)
			}
		})
	}

	// A backup file is checked where it lies.
	bak := filepath.Join(t.TempDir(), "monday.db")
	code, _, stderr := outpost(t, "db", "backup", "--data", sound, bak)
	require.Zero(t, code, stderr)
	before, err := os.ReadFile(bak)
	require.NoError(t, err)
	code, stdout, stderr := outpost(t, "db", "check", "--file", bak)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "store is sound")
	after, err := os.ReadFile(bak)
	require.NoError(t, err)
	require.Equal(t, before, after)
	require.NoFileExists(t, store.LockFile(bak))

	code, _, stderr = outpost(t, "db", "check", "--file", bak, "--data", sound)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "give --data DIR or --file FILE, not both")
	code, _, stderr = outpost(t, "db", "check", "--file", sound)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "is a folder: --file names a store file; for a data folder use --data "+sound)
	code, _, stderr = outpost(t, "db", "check", "--file", filepath.Join(sound, "nothing.db"))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no store file")
	require.NoFileExists(t, filepath.Join(sound, "nothing.db"))

	// An empty file is not taken for a new store.
	empty := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(empty, store.FileName), nil, 0o600))
	code, _, stderr = outpost(t, "db", "check", "--data", empty)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "empty")
	fi, err := os.Stat(filepath.Join(empty, store.FileName))
	require.NoError(t, err)
	require.Zero(t, fi.Size(), "db check wrote to an empty store file")
}

// The read-only open still sees a writer's lock: a check of a store that
// another process holds, with no control socket to reach it by, says so.
func TestDBCheckStoreInUse(t *testing.T) {
	dir := storeWithRun(t)
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	code, stdout, stderr := outpost(t, "db", "check", "--data", dir)
	require.Equal(t, 1, code, stdout)
	require.Contains(t, stderr, "is in use by another outpost process")
	require.Contains(t, stderr, "serves no control socket")
}

// Every db subcommand refuses arguments it does not take, and names its
// usage; nothing is done.
func TestDBExtraArguments(t *testing.T) {
	dir := storeWithRun(t)
	before := folderFiles(t, dir)
	out := t.TempDir()
	a, b := filepath.Join(out, "a.db"), filepath.Join(out, "b.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"check", "extra", "junk"}, `unexpected argument "extra": usage: outpost db check [flags]; to check a store file, such as a backup: outpost db check --file FILE`},
		{[]string{"compact", "extra-arg"}, `unexpected argument "extra-arg": usage: outpost db compact [flags]`},
		{[]string{"prune", "--older-than", "720h", "extra"}, `unexpected argument "extra": usage: outpost db prune --older-than D [flags]`},
		{[]string{"backup", a, b}, `unexpected argument "` + b + `": usage: outpost db backup [flags] FILE`},
		{[]string{"salvage", a, b}, `unexpected argument "` + b + `": usage: outpost db salvage [flags] FILE`},
		{[]string{"backup"}, `backup needs the file to write: usage: outpost db backup [flags] FILE`},
		{[]string{"salvage"}, `salvage needs the file to write: usage: outpost db salvage [flags] FILE`},
	} {
		code, stdout, stderr := outpost(t, append(append([]string{"db"}, tc.args...), "--data", dir)...)
		require.Equal(t, 2, code, tc.args)
		require.Empty(t, stdout, tc.args)
		require.Contains(t, stderr, tc.want, tc.args)
	}
	require.Equal(t, before, folderFiles(t, dir))
	require.NoFileExists(t, a)
	require.NoFileExists(t, b)

	// Given an existing file, the hint names it.
	bak := filepath.Join(out, "monday.db")
	code, _, stderr := outpost(t, "db", "backup", "--data", dir, bak)
	require.Zero(t, code, stderr)
	code, _, stderr = outpost(t, "db", "check", bak, "--data", dir)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "outpost db check --file "+bak)
}

func TestParseAge(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"720h": 720 * time.Hour, "30d": 720 * time.Hour, "1d12h": 36 * time.Hour, "1.5d": 36 * time.Hour,
		"90m": 90 * time.Minute, "0s": 0, "0": 0, "0d": 0, "-5h": -5 * time.Hour, "-1d": -24 * time.Hour,
		"2d30m15s": 48*time.Hour + 30*time.Minute + 15*time.Second,
	} {
		got, err := parseAge(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "d", "30", "30x", "12h1d", "1d-5h", "1dd", "1e3d", "1.2.3d", "d12h", "99999999999999d", "1d1d", "inf"} {
		_, err := parseAge(in)
		require.Error(t, err, in)
	}
}

// --older-than takes days; a mistake says which forms are accepted
// without the whole usage; 0s prunes every finished thread, a negative age
// is refused for what it is; and the hint to compact comes only when
// something was freed.
func TestDBPruneOlderThan(t *testing.T) {
	dir := storeWithRun(t)
	for _, tc := range []struct{ value, want string }{
		{"30x", `invalid value "30x" for flag -older-than: want a duration such as 720h, 30d, 1d12h or 90m (units d, h, m, s)`},
		{"720", `want a duration such as 720h, 30d, 1d12h or 90m`},
		{"-5h", `--older-than -5h is negative: give how long a finished thread has been idle, 0s or more, such as 720h or 30d`},
	} {
		code, stdout, stderr := outpost(t, "db", "prune", "--data", dir, "--older-than", tc.value)
		require.Equal(t, 2, code, tc.value)
		require.Empty(t, stdout)
		require.Contains(t, stderr, tc.want)
		require.NotContains(t, stderr, "-json", "the whole usage was printed")
	}
	code, _, stderr := outpost(t, "db", "prune", "--data", dir)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "prune needs --older-than")

	for _, v := range []string{"30d", "1d12h"} {
		code, stdout, stderr := outpost(t, "db", "prune", "--data", dir, "--older-than", v)
		require.Zero(t, code, stderr)
		require.Contains(t, stdout, "pruned 0 thread(s)", "the run just finished")
		require.NotContains(t, stdout, "db compact", "nothing was freed")
	}
	code, stdout, stderr := outpost(t, "db", "prune", "--data", dir, "--older-than", "0s")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "pruned 1 thread(s): 6 checkpoints")
	require.Contains(t, stdout, `run "outpost db compact" to give the freed pages back`)
	code, stdout, stderr = outpost(t, "db", "prune", "--data", dir, "--older-than", "0s")
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "pruned 0 thread(s)", "the thread has one checkpoint left")
	require.NotContains(t, stdout, "db compact")
}

// Destinations are refused in the operator's terms, before any work: a
// folder, a folder that does not exist (without the temporary file's
// name), an existing file.
func TestDBDestinationMessages(t *testing.T) {
	dir := storeWithRun(t)
	folder := t.TempDir()
	existing := filepath.Join(folder, "old.db")
	require.NoError(t, os.WriteFile(existing, []byte("keep me"), 0o600))
	missing := filepath.Join(folder, "nodir", "x")
	for _, sub := range []string{"backup", "salvage"} {
		for _, tc := range []struct{ dst, want string }{
			{folder, folder + " is a folder: give a file name, such as " + folder + string(filepath.Separator) + "outpost-"},
			{filepath.Join(missing, "b.db"), "folder " + missing + " does not exist"},
			{existing, existing + " already exists: it is never overwritten"},
		} {
			code, stdout, stderr := outpost(t, "db", sub, "--data", dir, tc.dst)
			require.Equal(t, 1, code, sub, tc.dst)
			require.Empty(t, stdout)
			require.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %s", stderr)
			require.Contains(t, stderr, tc.want)
			require.NotContains(t, stderr, ".tmp")
			require.NotContains(t, stderr, ".salvage")
		}
	}
	b, err := os.ReadFile(existing)
	require.NoError(t, err)
	require.Equal(t, "keep me", string(b))
	entries, err := os.ReadDir(folder)
	require.NoError(t, err)
	require.Len(t, entries, 1, "only old.db")
}

// A backup of a store with a damaged record fails, says that the fault is
// in the store and what to run, and leaves no file that could pass for a
// sound backup; the store is not changed.
func TestDBBackupOfDamagedStore(t *testing.T) {
	dir := storeWithRun(t)
	damageRunRecords(t, dir)
	before, err := os.ReadFile(filepath.Join(dir, store.FileName))
	require.NoError(t, err)
	bak := filepath.Join(t.TempDir(), "f60.db")
	code, stdout, stderr := outpost(t, "db", "backup", "--data", dir, bak)
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "the store in "+dir+" is damaged: it has 1 problem(s); first: runs ")
	require.Contains(t, stderr, "The backup copied the damage")
	require.Contains(t, stderr, bak+" was removed")
	require.Contains(t, stderr, "outpost db check --data "+dir)
	require.Contains(t, stderr, "outpost db salvage --data "+dir+" FILE")
	require.NoFileExists(t, bak)
	require.NoFileExists(t, bak+".tmp")
	after, err := os.ReadFile(filepath.Join(dir, store.FileName))
	require.NoError(t, err)
	require.Equal(t, before, after, "the backup changed the store")
}

// A copy that is damaged while the store checks clean is blamed on the
// copy, and removed too.
func TestVerifyBackupBlamesTheCopy(t *testing.T) {
	dir := storeWithRun(t)
	dst := filepath.Join(t.TempDir(), "b.db")
	require.NoError(t, os.WriteFile(dst, []byte(strings.Repeat("not a store ", 1000)), 0o600))
	clean := func() (*store.CheckReport, error) { return &store.CheckReport{}, nil }
	_, err := verifyBackup(context.Background(), dir, dst, clean)
	require.ErrorContains(t, err, "the backup does not open")
	require.ErrorContains(t, err, "but the store in "+dir+" checks clean: the copy was damaged as it was written")
	require.ErrorContains(t, err, dst+" was removed")
	require.NoFileExists(t, dst)
}

// db JSON prints empty lists as [], and check's text lists counts that
// add up to the total it prints, and says that the hash chain was verified.
func TestDBCheckOutputDetails(t *testing.T) {
	dir := storeWithRun(t)
	code, stdout, stderr := outpost(t, "db", "check", "--data", dir, "--json")
	require.Zero(t, code, stderr)
	var rep map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep))
	require.Equal(t, "[]", string(rep["problems"]))

	code, stdout, stderr = outpost(t, "db", "check", "--data", dir)
	require.Zero(t, code, stderr)
	m := regexp.MustCompile(`checked (\d+) records: (.*)\n`).FindStringSubmatch(stdout)
	require.NotNil(t, m, stdout)
	total, listed := atoi(t, m[1]), 0
	for _, part := range strings.Split(m[2], ", ") {
		i := strings.LastIndexByte(part, ' ')
		listed += atoi(t, part[i+1:])
	}
	require.Equal(t, total, listed, "the counts listed do not add up: %s", m[0])
	require.Contains(t, m[2], "thread heads 1")
	require.Contains(t, m[2], "outcome index entries 1")
	require.Contains(t, stdout, "outcome ledger: the hash chain of its 1 record(s) is whole\n")

	salvaged := filepath.Join(t.TempDir(), "s.db")
	code, stdout, stderr = outpost(t, "db", "salvage", "--data", dir, salvaged, "--json")
	require.Zero(t, code, stderr)
	var srep struct {
		Lost  json.RawMessage `json:"lost"`
		Check struct {
			Problems json.RawMessage `json:"problems"`
		} `json:"check"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &srep))
	require.Equal(t, "[]", string(srep.Lost))
	require.Equal(t, "[]", string(srep.Check.Problems))

	// A broken chain is not called whole.
	damaged := storeWithRun(t)
	bdb, err := bbolt.Open(filepath.Join(damaged, store.FileName), 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("outcomes"))
		k, v := b.Cursor().First()
		v = append([]byte(nil), v...)
		v[len(v)/2] ^= 0xff
		return b.Put(append([]byte(nil), k...), v)
	}))
	require.NoError(t, bdb.Close())
	code, stdout, _ = outpost(t, "db", "check", "--data", damaged)
	require.Equal(t, 1, code)
	require.Contains(t, stdout, "PROBLEM outcomes")
	require.NotContains(t, stdout, "hash chain")
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err, s)
	return n
}

// db compact on a folder with no store says so as the other db commands
// do, and leaves nothing behind.
func TestDBCompactMissingFolder(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	for _, sub := range []string{"check", "compact", "prune --older-than 1h", "backup " + filepath.Join(t.TempDir(), "b.db")} {
		code, _, stderr := outpost(t, append(append([]string{"db"}, strings.Fields(sub)...), "--data", missing)...)
		require.Equal(t, 1, code, sub)
		require.Contains(t, stderr, "no store in "+missing+": ", sub)
	}
	require.NoDirExists(t, missing)
}

// Each db subcommand's -h goes to stdout, exits 0, names its arguments and
// lists only its own flags.
func TestDBHelp(t *testing.T) {
	for _, tc := range []struct {
		sub, usage string
		flags      []string
	}{
		{"check", "Usage: outpost db check [flags]\n", []string{"-data DIR", "-json", "-file FILE"}},
		{"backup", "Usage: outpost db backup [flags] FILE\n", []string{"-data DIR", "-json"}},
		{"compact", "Usage: outpost db compact [flags]\n", []string{"-data DIR", "-json"}},
		{"prune", "Usage: outpost db prune --older-than D [flags]\n", []string{"-data DIR", "-json", "-older-than D"}},
		{"salvage", "Usage: outpost db salvage [flags] FILE\n", []string{"-data DIR", "-json", "-appliance-id ID"}},
	} {
		for _, h := range []string{"-h", "--help"} {
			code, stdout, stderr := outpost(t, "db", tc.sub, h)
			require.Zero(t, code, tc.sub)
			require.Empty(t, stderr, tc.sub)
			require.True(t, strings.HasPrefix(stdout, tc.usage), "%s:\n%s", tc.sub, stdout)
			flags := regexp.MustCompile(`(?m)^  (-\S+)`).FindAllStringSubmatch(stdout, -1)
			require.Len(t, flags, len(tc.flags), "%s:\n%s", tc.sub, stdout)
			for _, f := range tc.flags {
				require.Contains(t, stdout, "\n  "+f+"\n", tc.sub)
			}
		}
	}
	code, stdout, stderr := outpost(t, "db", "-h")
	require.Zero(t, code)
	require.Empty(t, stderr)
	require.Contains(t, stdout, "Usage: outpost db <check|backup|compact|prune|salvage> [flags]")
	// check's line names the runs it warns of, prune's the kept copies it
	// removes.
	check := stdout[strings.Index(stdout, "\n  check "):strings.Index(stdout, "\n  check --file")]
	require.Contains(t, check, "warn of runs waiting for a person whose\n                     pinned bundle is on disk nowhere (stranded)")
	require.Contains(t, stdout, "remove the copies of embedded\n                     bundles kept in DATA/firmware/.embedded that no run refers to")

	code, stdout, stderr = outpost(t, "db", "check", "--no-such-flag")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "flag provided but not defined: -no-such-flag\nusage: outpost db check [flags] (outpost db check -h lists its flags)")

	// An unknown or missing subcommand is a usage error, exit 2, as an
	// unknown command is.
	code, _, stderr = outpost(t, "db", "frob")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `unknown db subcommand "frob"`)
	code, _, stderr = outpost(t, "db")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "Usage: outpost db")
}

// One damaged run record does not keep the appliance from starting, nor
// hide the other runs: run warns and goes on, runs list shows the rest and
// names what it left out, with a non-zero exit. Recovery reads only the
// runs that were not over (the store's index of them): the damaged one
// here is one a crash left running.
func TestADamagedRunRecordDoesNotStopTheAppliance(t *testing.T) {
	dir := storeWithRun(t)
	damageRunRecords(t, dir) // t1's run
	markUnfinished(t, dir)
	code, stdout, stderr := outpost(t, "run", "--data", dir, "--thread", "t2", "I forgot my lisinopril dose")
	require.Zero(t, code, stderr)
	require.Contains(t, stderr, "WARNING: recover: 1 run record(s) cannot be read")
	require.Contains(t, stderr, "checksum mismatch")
	require.Contains(t, stdout, "completed")

	code, stdout, stderr = outpost(t, "runs", "list", "--data", dir)
	require.Equal(t, 1, code)
	require.Contains(t, stdout, "t2")
	require.NotContains(t, stdout, "t1")
	require.Contains(t, stderr, "left out: ")
	require.Contains(t, stderr, "1 run record(s) cannot be read and were left out of the list (run outpost db check)")
}

// Under --json a run's key is the plain string, not quoted again inside
// the JSON string, and the text output names it too; the lists of a
// prune report are [] when empty, never null or left out.
func TestDBJSONKeysAndLists(t *testing.T) {
	dir := storeWithRun(t)
	code, stdout, stderr := outpost(t, "runs", "list", "--data", dir, "--json")
	require.Zero(t, code, stderr)
	var list struct {
		Runs []struct {
			ID string `json:"id"`
		} `json:"runs"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &list), stdout)
	require.Len(t, list.Runs, 1)
	id := list.Runs[0].ID

	code, stdout, stderr = outpost(t, "db", "prune", "--data", dir, "--older-than", "30d", "--json")
	require.Zero(t, code, stderr)
	var prune map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &prune), stdout)
	require.Equal(t, []any{}, prune["skipped"], stdout)

	damageRunRecords(t, dir)
	code, stdout, _ = outpost(t, "db", "check", "--data", dir, "--json")
	require.Equal(t, 1, code)
	var rep store.CheckReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep), stdout)
	require.Len(t, rep.Problems, 1, stdout)
	require.Equal(t, store.Problem{Bucket: "runs", Key: id, Message: "checksum mismatch"}, rep.Problems[0], stdout)
	require.Contains(t, stdout, `"key": "`+id+`"`)

	code, stdout, _ = outpost(t, "db", "check", "--data", dir)
	require.Equal(t, 1, code)
	require.Contains(t, stdout, "PROBLEM runs "+id+": checksum mismatch")
}

// A store file that is refused when a writing command opens it leaves
// the data folder as it was: no lock file appears beside it.
func TestRefusedStoreLeavesFolderAsItWas(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, store.FileName), make([]byte, 64<<10), 0o600))
	before := folderFiles(t, dir)
	code, _, stderr := outpost(t, "db", "prune", "--data", dir, "--older-than", "1h")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "store file is damaged")
	require.Equal(t, before, folderFiles(t, dir))
	require.NoFileExists(t, filepath.Join(dir, store.LockFile(store.FileName)))
}

// A control socket that a killed owner left behind answers nothing: the
// db commands then open the file, as if there were no socket.
func TestDBStaleControlSocket(t *testing.T) {
	dir := storeWithRun(t)
	l, err := net.Listen("unix", filepath.Join(dir, store.ControlSocket))
	require.NoError(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
	require.FileExists(t, filepath.Join(dir, store.ControlSocket), "the socket's file stays, as after a kill -9")
	code, stdout, stderr := outpost(t, "db", "check", "--data", dir)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "store is sound")
	code, stdout, stderr = outpost(t, "runs", "list", "--data", dir)
	require.Zero(t, code, stderr)
	require.Contains(t, stdout, "completed")
}

// db salvage of a store another process owns says so once, with the
// advice that fits: it gave two pieces of advice, one after the other
// ("stop the process that owns it first: ... stop serve first").
func TestSalvageOfAStoreInUse(t *testing.T) {
	dir := storeWithRun(t)
	db, err := store.OpenDir(dir, store.Options{})
	require.NoError(t, err)
	defer db.Close()
	out := filepath.Join(t.TempDir(), "s.db")
	code, _, stderr := outpost(t, "db", "salvage", "--data", dir, out)
	require.Equal(t, 1, code)
	require.Equal(t, "outpost db: salvage "+filepath.Join(dir, store.FileName)+
		": in use by another outpost process: salvage reads the store file itself; stop serve first\n", stderr)
	require.NoFileExists(t, out)
}

// A damaged backup, checked with --file, is told how to salvage it: db
// salvage reads DIR/outpost.db, so the hint "outpost db salvage --data
// DIR FILE" with the backup's folder named no store at all. Following the
// hint it gives now reaches the file. The cut takes the last page, and
// the root page, which both of a backup's meta pages name, is lost too:
// salvage then finds the records on the other pages one by one, and says
// so (before, it copied nothing).
func TestDBCheckFileOfADamagedBackup(t *testing.T) {
	bak := filepath.Join(t.TempDir(), "monday.db")
	code, _, stderr := outpost(t, "db", "backup", "--data", storeWithRun(t), bak)
	require.Zero(t, code, stderr)
	data, err := os.ReadFile(bak)
	require.NoError(t, err)
	ps, root := int(binary.LittleEndian.Uint32(data[24:])), int(binary.LittleEndian.Uint64(data[32:])) // the first meta page's
	data = data[:len(data)-ps]                                                                         // its last page
	if root*ps < len(data) {
		clear(data[root*ps : (root+1)*ps])
	}
	require.NoError(t, os.WriteFile(bak, data, 0o600))

	code, _, stderr = outpost(t, "db", "check", "--file", bak)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "it was cut short")
	require.NotContains(t, stderr, "--data "+filepath.Dir(bak))
	require.Contains(t, stderr, "(with no sound copy, copy out what can still be read: copy the file into an empty folder as outpost.db, "+
		"then run outpost db salvage --data FOLDER NEWFILE)")

	folder := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(folder, store.FileName), data, 0o600))
	code, stdout, stderr := outpost(t, "db", "salvage", "--data", folder, filepath.Join(t.TempDir(), "s.db"))
	require.NotContains(t, stderr, "no store in")
	require.Equal(t, 1, code, stdout+stderr) // not whole
	require.Contains(t, stderr, "the copy is not whole")
	require.Contains(t, stdout, "LOST the root page cannot be read from either meta page")
	require.Regexp(t, `of them, [1-9][0-9]* found on pages that nothing led to any more \(`, stdout)
}

// A file that is no store, checked with --file, is called a file: the
// hint spoke of "this data folder", which --file does not name.
func TestDBCheckFileOfNoStore(t *testing.T) {
	junk := filepath.Join(t.TempDir(), "notes.db")
	require.NoError(t, os.WriteFile(junk, []byte(strings.Repeat("not a store\n", 4096)), 0o600))
	code, _, stderr := outpost(t, "db", "check", "--file", junk)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "unsupported store format")
	require.Contains(t, stderr, "(this file was written by an incompatible outpost version, or is not an outpost store)")
}

// --data naming the store file rather than its folder, an easy slip after
// db check --file, says so: it said "stat DIR/outpost.db/outpost.db: not
// a directory".
func TestDataFlagNamingAFile(t *testing.T) {
	file := filepath.Join(storeWithRun(t), store.FileName)
	for _, args := range [][]string{{"db", "check"}, {"db", "compact"}, {"runs", "list"}} {
		code, _, stderr := outpost(t, append(args, "--data", file)...)
		require.Equal(t, 1, code, args)
		require.Contains(t, stderr, "no store in "+file+": it is a file: --data names the folder that holds "+store.FileName+
			" (db check --file checks a store file)", args)
	}
}
