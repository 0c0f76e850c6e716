package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

// A store whose root page is lost, salvaged with the binary, keeps its
// appliance ID, and its ledger goes on upstream: the collector takes the
// outcomes run after the salvage as the same appliance's, its chain whole.
// Before, the copy got a new ID, salvage did not say so, and the flush was
// refused: the records carried the old ID, the batch the new one.
func TestSalvagedStoreGoesOnUpstream(t *testing.T) {
	app, coll := t.TempDir(), t.TempDir()
	for _, input := range []string{"I forgot my metformin dose", "what is metformin for?", "I took two doses by mistake"} {
		code, _, errs := outpost(t, "run", "--data", app, input)
		require.Zero(t, code, errs)
	}
	code, out, errs := outpost(t, "uplink", "status", "--data", app, "--json")
	require.Zero(t, code, errs)
	var before uplink.Status
	require.NoError(t, json.Unmarshal([]byte(out), &before))

	secrets, mine := uplinkSecrets(t, t.TempDir(), coll, before.ApplianceID)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url, _, done := startCollector(t, ctx, coll, secrets)
	code, _, errs = outpost(t, "uplink", "flush", "--data", app, "--url", url, "--secret-file", mine)
	require.Zero(t, code, errs)

	db := filepath.Join(app, store.FileName)
	zeroRootPages(t, db)
	copied := filepath.Join(t.TempDir(), "salvaged.db")
	code, out, errs = outpostBin(t, "", "db", "salvage", "--data", app, copied)
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

	cancel()
	require.Zero(t, <-done)
	st, err := uplink.OpenBoltStore(coll)
	require.NoError(t, err)
	defer st.Close()
	list, err := st.Appliances(context.Background())
	require.NoError(t, err)
	require.Len(t, list, 1, "the collector sees another appliance")
	assert.Equal(t, before.ApplianceID, list[0].ApplianceID)
	assert.Equal(t, before.LastSeq+1, list[0].LastSeq)
	assert.Equal(t, "ok", list[0].Chain)
}
