//go:build !linux

package chunkcache

import "os"

// reserve does nothing where fallocate is not available: a full disk is
// found by the writes instead.
func reserve(*os.File, int64) error { return nil }
