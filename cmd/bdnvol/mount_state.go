package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/bdnvol/bdnvol/pkg/mounts"
)

// mountStore is where mounts record their state: $XDG_RUNTIME_DIR/bdnvol/mounts,
// else mounts/ under the cache directory.
func (g *Globals) mountStore() mounts.Store {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return mounts.Store{Dir: filepath.Join(d, "bdnvol", "mounts")}
	}
	return mounts.Store{Dir: filepath.Join(g.cacheDir(), "mounts")}
}

// logf prints one "bdnvol: " line to stderr.
func (g *Globals) logf(format string, args ...any) {
	fmt.Fprintf(g.stderr, "bdnvol: "+format+"\n", args...)
}
