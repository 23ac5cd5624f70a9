package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/bdnvol/bdnvol/internal/termsafe"
)

// UmountCmd unmounts a bdnvol mount.
type UmountCmd struct {
	Mountpoint string        `arg:"" type:"path" help:"Where the version is mounted, or the root of a mount --spec (unmounts all of it)."`
	Timeout    time.Duration `default:"30s" help:"How long to wait for the mount process to unmount."`
}

// Run unmounts the mount at the mountpoint, or every mount under a
// `mount --spec` root. A mount that shares its process with others (a spec)
// is unmounted alone and the process serves on; otherwise the process is
// asked to unmount and exit. A mount whose process is gone is detached.
func (c *UmountCmd) Run(ctx context.Context, g *Globals) error {
	mp, err := filepath.Abs(c.Mountpoint)
	if err != nil {
		return usageError{err}
	}
	if _, ok := mountedAt(mp); ok {
		return c.umountOne(ctx, g, mp)
	}
	under, err := mountsUnder(mp)
	if err != nil {
		return err
	}
	if len(under) == 0 {
		return fmt.Errorf("%s: not a bdnvol mount", mp)
	}
	for _, m := range under {
		if err := c.umountOne(ctx, g, m.Mountpoint); err != nil {
			return err
		}
	}
	return nil
}

// umountOne unmounts the bdnvol mount at mp.
func (c *UmountCmd) umountOne(ctx context.Context, g *Globals, mp string) error {
	m, ok := mountedAt(mp)
	if !ok {
		return nil // gone meanwhile
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
	deadline := time.Now().Add(c.Timeout)
	if g.servedBy(st.PID) > 1 {
		// The process serves other mounts too: unmount this one only; the
		// process sees it go and keeps serving the rest.
		for {
			err := unmountFUSE(mp)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("unmount %s: %w", mp, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(250 * time.Millisecond):
			}
		}
		for i := 0; i < 50; i++ {
			if _, ok := g.readState(mp); !ok {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		fmt.Fprintf(g.stderr, "bdnvol: unmounted %s\n", mp)
		return nil
	}
	if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil {
		return fmt.Errorf("unmount %s: signal pid %d: %w", mp, st.PID, err)
	}
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
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", termsafe.Name(o.Mountpoint), termsafe.Name(o.Digest), termsafe.Name(ref), pid)
	}
	return w.Flush()
}
