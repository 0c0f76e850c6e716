//go:build outpost_reference_override

package firmware

import "os"

// A test binary built with this tag embeds, in effect, the bundle folder
// $OUTPOST_TEST_REFERENCE names: two runs of it with two folders are two
// binaries with different embedded bundles.
func init() { referenceOverride = os.Getenv("OUTPOST_TEST_REFERENCE") }
