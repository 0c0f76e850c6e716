package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/firmware"
	"github.com/outpost-edge/outpost/uplink"
)

// The outcomes of runs made under an earlier binary's embedded bundle
// leave, after the binary is replaced, with that bundle's redaction
// policy, read from the copy kept in the data folder: not with the new
// binary's policy, and not with the identity fields alone. An outcome
// whose bundle is on disk nowhere leaves with the identity fields alone,
// and the flush says so.
func TestUplinkFlushRedactsWithKeptBundlePolicy(t *testing.T) {
	bin, app, coll := builtOutpostTagged(t), t.TempDir(), t.TempDir()
	old, err := firmware.Reference()
	require.NoError(t, err)
	oldRef := old.Ref()
	// Binary B's policy lets the status alone out, where A's lets the
	// run id out too.
	upgraded := upgradedReference(t, "BINARY-B")
	require.NoError(t, os.WriteFile(filepath.Join(upgraded, "redaction.json"), []byte(`{"fields": ["status"], "detectors": []}`), 0o644))
	require.NoError(t, firmware.Sign(upgraded, filepath.Join("..", "..", "testdata", "keys", "dev.key")))
	envB := []string{"OUTPOST_TEST_REFERENCE=" + upgraded}

	code, _, stderr := outpostBinEnv(t, bin, nil, "", "run", "--data", app, "I forgot my metformin dose this morning")
	require.Zero(t, code, stderr)
	kept := filepath.Join(app, "firmware", ".embedded", oldRef.Name,
		strconv.FormatInt(oldRef.Version, 10)+"-"+strings.TrimPrefix(oldRef.Digest, "sha256:"))
	require.DirExists(t, kept)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, url, mine, _, done := startCollectorFor(t, ctx, app, coll)

	code, _, stderr = outpostBinEnv(t, bin, envB, "", "uplink", "flush", "--data", app, "--url", url, "--secret-file", mine)
	require.Zero(t, code, stderr)
	assert.NotContains(t, stderr, "alone in clear")

	// A second run under A, whose kept copy is then removed, is on disk
	// nowhere when B flushes it.
	code, _, stderr = outpostBinEnv(t, bin, nil, "", "run", "--data", app, "I forgot my metformin dose again")
	require.Zero(t, code, stderr)
	require.NoError(t, os.RemoveAll(kept))
	code, _, stderr = outpostBinEnv(t, bin, envB, "", "uplink", "flush", "--data", app, "--url", url, "--secret-file", mine)
	require.Zero(t, code, stderr)
	assert.Contains(t, stderr, "uplink: the outcomes of bundle "+oldRef.Name+" v"+strconv.FormatInt(oldRef.Version, 10)+
		" ("+oldRef.Digest+") leave with appliance_id, seq and outcome_id alone in clear, since its redaction policy cannot be read: "+
		"this binary does not embed it, and the firmware folder holds no copy of it")

	cancel()
	require.Equal(t, 0, <-done)
	cs, err := uplink.OpenBoltStore(coll)
	require.NoError(t, err)
	defer cs.Close()
	recs, err := cs.Records(context.Background(), st.ApplianceID, 0, 0)
	require.NoError(t, err)
	require.Len(t, recs, 2)
	first, second := string(recs[0].Line), string(recs[1].Line)
	// A's policy: the run id in clear, no field home.
	assert.Contains(t, first, `"status":"completed"`)
	assert.Contains(t, first, `"run":"run_`)
	assert.NotContains(t, first, `"redacted"`)
	// Fail-closed: nothing but the identity fields in clear.
	assert.NotContains(t, second, `"status":"completed"`)
	assert.NotContains(t, second, `"run":"run_`)
	assert.Contains(t, second, `"redacted"`)
}
