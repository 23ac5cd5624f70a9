// Package testutil holds the fakes and builders that the tests of several
// bdnvol packages share: deterministic bytes, trees on disk, a counting
// fetcher, a goroutine-safe buffer, hand-made OCI layouts for fuzzing.
// Only tests import it, and it imports no bdnvol package, so that the
// internal tests of any package (pkg/layout, pkg/oci) can use it.
package testutil
