package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"

	"github.com/outpost-edge/outpost/store"
)

func TestRunsReplay(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := outpost(t, "run", "--data", dir, "--thread", "a", "I forgot my metformin dose")
	require.Zero(t, code, stderr)
	code, stdout, stderr = outpost(t, "run", "--data", dir, "--thread", "a", "remind me to refill metformin")
	require.Zero(t, code, stderr)
	m := regexp.MustCompile(`outpost resume (run_\w+) --interrupt (int_\w+)`).FindStringSubmatch(stdout)
	require.Len(t, m, 3, stdout)
	code, _, stderr = outpost(t, "resume", "--data", dir, m[1], "--interrupt", m[2], "--decision", "edit", "--value", `"We will call you."`, "--by", "nurse")
	require.Zero(t, code, stderr)

	code, stdout, stderr = outpost(t, "runs", "replay", m[1], "--data", dir, "--json")
	require.Zero(t, code, stderr)
	var rep struct {
		Same  bool
		Steps int
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep))
	require.True(t, rep.Same, stdout)
	require.Equal(t, 7, rep.Steps)

	// Take the recorded model response away: the replay must not ask a
	// model, so it parts from the original and says where.
	bdb, err := bbolt.Open(filepath.Join(dir, store.FileName), 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, bdb.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("toolcalls"))
		var keys [][]byte
		_ = b.ForEach(func(k, _ []byte) error {
			if bytes.HasPrefix(k, []byte("model:"+m[1])) {
				keys = append(keys, append([]byte(nil), k...))
			}
			return nil
		})
		require.NotEmpty(t, keys, "the run's model call was recorded")
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	}))
	require.NoError(t, bdb.Close())
	code, stdout, stderr = outpost(t, "runs", "replay", m[1], "--data", dir)
	require.Equal(t, 1, code)
	require.Contains(t, stdout, "does not replay")
	require.Contains(t, stdout, "generate_response")
	require.Contains(t, stderr, "differs from the original")
}
