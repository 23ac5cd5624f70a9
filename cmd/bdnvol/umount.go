package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"syscall"
	"text/tabwriter"
	"time"
)

// UmountCmd unmounts a bdnvol mount.
type UmountCmd struct {
	Mountpoint string        `arg:"" type:"path" help:"Where the version is mounted."`
	Timeout    time.Duration `default:"30s" help:"How long to wait for the mount process to unmount."`
}

// Run asks the mount's process to unmount and waits until the mount is
// gone; a mount whose process is gone is detached directly.
func (c *UmountCmd) Run(ctx context.Context, g *Globals) error {
	mp, err := filepath.Abs(c.Mountpoint)
	if err != nil {
		return usageError{err}
	}
	m, ok := mountedAt(mp)
	if !ok {
		return fmt.Errorf("%s: not a bdnvol mount", mp)
	}
	st, _ := g.readState(mp)
	if !alive(st.PID) || isNotConnected(mp) {
		if err := detach(mp); err != nil {
			return fmt.Errorf("unmount %s: %w", mp, err)
		}
		g.removeState(mp, 0)
		fmt.Fprintf(g.stderr, "bdnvol: removed the stale mount at %s (%s)\n", mp, m.Digest)
		return nil
	}
	if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil {
		return fmt.Errorf("unmount %s: signal pid %d: %w", mp, st.PID, err)
	}
	deadline := time.Now().Add(c.Timeout)
	for time.Now().Before(deadline) {
		if _, still := mountedAt(mp); !still {
			// Let the process finish its own clean-up (state file).
			for i := 0; i < 50 && alive(st.PID); i++ {
				time.Sleep(20 * time.Millisecond)
			}
			fmt.Fprintf(g.stderr, "bdnvol: unmounted %s\n", mp)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("unmount %s: pid %d did not unmount within %v", mp, st.PID, c.Timeout)
}

// MountsCmd lists the bdnvol mounts on the machine.
type MountsCmd struct {
	JSON bool `name:"json" help:"Print a JSON array instead of a table."`
}

type mountsOutput struct {
	Mountpoint string `json:"mountpoint"`
	Digest     string `json:"digest"`
	Reference  string `json:"reference,omitempty"`
	PID        int    `json:"pid,omitempty"`
	Stale      bool   `json:"stale"`
}

// Run lists the mounts.
func (c *MountsCmd) Run(g *Globals) error {
	ms, err := bdnvolMounts()
	if err != nil {
		return err
	}
	out := []mountsOutput{}
	for _, m := range ms {
		o := mountsOutput{Mountpoint: m.Mountpoint, Digest: m.Digest}
		if st, ok := g.readState(m.Mountpoint); ok && st.Digest == m.Digest {
			o.Reference, o.PID = st.Reference, st.PID
		}
		o.Stale = isNotConnected(m.Mountpoint) || (o.PID != 0 && !alive(o.PID))
		out = append(out, o)
	}
	if c.JSON {
		return json.NewEncoder(g.stdout).Encode(out)
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
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", o.Mountpoint, o.Digest, ref, pid)
	}
	return w.Flush()
}
