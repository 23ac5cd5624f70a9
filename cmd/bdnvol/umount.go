package main

import (
	"context"
	"fmt"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/mounts"
)

// UmountCmd unmounts a bdnvol mount.
type UmountCmd struct {
	Mountpoint string        `arg:"" type:"path" help:"Where the version is mounted, or the root of a mount --spec (unmounts all of it)."`
	Timeout    time.Duration `default:"30s" help:"How long to wait for the mount process to unmount."`
}

// Run unmounts the mount at the mountpoint, or every mount under a
// `mount --spec` root.
func (c *UmountCmd) Run(ctx context.Context, g *Globals) error {
	mp, err := filepath.Abs(c.Mountpoint)
	if err != nil {
		return usageError{err}
	}
	return g.mountStore().UnmountAll(ctx, mp, c.Timeout, func(m mounts.Mount, how mounts.Outcome) {
		switch how {
		case mounts.Stale:
			fmt.Fprintf(g.stderr, "bdnvol: removed the stale mount at %s (%s)\n", m.Mountpoint, m.Digest)
		case mounts.Unmounted:
			fmt.Fprintf(g.stderr, "bdnvol: unmounted %s\n", m.Mountpoint)
		}
	})
}

// MountsCmd lists the bdnvol mounts on the machine.
type MountsCmd struct {
	JSON bool `name:"json" help:"Print a JSON array instead of a table."`
}

// Run lists the mounts.
func (c *MountsCmd) Run(g *Globals) error {
	out, err := g.mountStore().Statuses()
	if err != nil {
		return err
	}
	if c.JSON {
		return g.printJSON(out)
	}
	w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "MOUNTPOINT\tDIGEST\tREFERENCE\tPID")
	for _, o := range out {
		pid := "-"
		if o.PID != 0 {
			pid = fmt.Sprint(o.PID)
		}
		if o.Stale {
			pid += " (stale)"
		}
		ref := o.Reference
		if ref == "" {
			ref = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", termsafe.Name(o.Mountpoint), termsafe.Name(o.Digest), termsafe.Name(ref), pid)
	}
	return w.Flush()
}
