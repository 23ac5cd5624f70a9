package main

import (
	"fmt"

	"github.com/bdnvol/bdnvol/pkg/mounts"
)

// mountStore is where mounts record their state.
func (g *Globals) mountStore() mounts.Store { return mounts.DefaultStore(g.cacheDir()) }

// logf prints one "bdnvol: " line to stderr.
func (g *Globals) logf(format string, args ...any) {
	fmt.Fprintf(g.stderr, "bdnvol: "+format+"\n", args...)
}
