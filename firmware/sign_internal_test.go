package firmware

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The exported reference bundle, signed with another key, no longer says
// that the development key signs it (it said so after any re-signing);
// signed with the development key, it still does. The embedded bundle's
// description is the one Sign looks for.
func TestSignedReferenceDescribesItsKey(t *testing.T) {
	ref, err := Reference()
	require.NoError(t, err)
	require.Equal(t, referenceDescription, ref.Manifest.Description)

	keys := t.TempDir()
	id, err := Keygen(keys)
	require.NoError(t, err)
	for _, tc := range []struct {
		key, want string
	}{
		{filepath.Join(keys, id+".key"), resignedReferenceDescription},
		{filepath.Join("..", "testdata", "keys", "dev.key"), referenceDescription},
	} {
		dir := filepath.Join(t.TempDir(), "bundle")
		require.NoError(t, Export(dir))
		require.NoError(t, Sign(dir, tc.key))
		raw, err := os.ReadFile(filepath.Join(dir, ManifestFile))
		require.NoError(t, err)
		m, err := DecodeManifest(raw)
		require.NoError(t, err)
		require.Equal(t, tc.want, m.Description, tc.key)
		ring, err := LoadKeyring(keys, filepath.Join("..", "testdata", "keys", "dev.pub"))
		require.NoError(t, err)
		_, err = Load(dir, ring)
		require.NoError(t, err, "the signed bundle verifies")
	}
}
