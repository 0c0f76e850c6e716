package store

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-edge/outpost/engine"
	"github.com/outpost-edge/outpost/engine/enginetest"
)

func openTest(t *testing.T) *DB {
	t.Helper()
	d, err := Open(filepath.Join(t.TempDir(), FileName), Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func TestConformance(t *testing.T) {
	enginetest.RunStoreSuite(t, func(t *testing.T) engine.Store {
		d := openTest(t)
		// Whatever a case commits, the store must stay sound: in particular
		// its heads and branches must record exactly each namespace's leaves.
		// Cases may name parents they never store, and save pending writes
		// against checkpoints they never store, which Check reports.
		t.Cleanup(func() {
			rep, err := d.Check(bg)
			require.NoError(t, err)
			for _, p := range rep.Problems {
				parent := strings.HasPrefix(p.Message, "parent checkpoint ") && strings.HasSuffix(p.Message, " is missing")
				write := p.Bucket == bucketWrites && strings.HasPrefix(p.Message, "a pending write of checkpoint ") &&
					strings.HasSuffix(p.Message, ", which does not exist")
				if !parent && !write {
					t.Errorf("check: %v", p)
				}
			}
		})
		return d
	})
}

var bg = context.Background()
