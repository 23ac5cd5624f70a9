package mounts

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/bdnvol/bdnvol/internal/proc"
)

// Outcome says how Unmount removed a mount.
type Outcome int

// The ways Unmount removes a mount.
const (
	Gone      Outcome = iota // it was no longer mounted
	Unmounted                // its process unmounted it
	Stale                    // its process was gone; it was detached
)

// UnmountAll unmounts the bdnvol mount at mp, else every one under mp (see
// Targets), one by one with Unmount; done (if not nil) is told of each.
func (s Store) UnmountAll(ctx context.Context, mp string, timeout time.Duration, done func(Mount, Outcome)) error {
	targets, err := Targets(mp)
	if err != nil {
		return err
	}
	for _, m := range targets {
		how, err := s.Unmount(ctx, m.Mountpoint, timeout)
		if err != nil {
			return err
		}
		if done != nil {
			done(m, how)
		}
	}
	return nil
}

// Unmount removes the bdnvol mount at mp. A mount whose process is gone is
// detached. A mount that shares its process with others (a spec) is
// unmounted alone and the process serves on; otherwise the process is
// asked (SIGTERM) to unmount and exit, and Unmount waits up to timeout.
func (s Store) Unmount(ctx context.Context, mp string, timeout time.Duration) (Outcome, error) {
	if _, ok := At(mp); !ok {
		return Gone, nil
	}
	st, _ := s.Read(mp)
	if !proc.Alive(st.PID, "") || NotConnected(mp) {
		if err := Detach(mp); err != nil {
			return Stale, fmt.Errorf("unmount %s: %w", mp, err)
		}
		s.Remove(mp, 0)
		return Stale, nil
	}
	deadline := time.Now().Add(timeout)
	if s.ServedBy(st.PID) > 1 {
		// The process serves other mounts too: unmount this one only; the
		// process sees it go and keeps serving the rest.
		for {
			err := UnmountFUSE(mp)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return Unmounted, fmt.Errorf("unmount %s: %w", mp, err)
			}
			if err := sleep(ctx, 250*time.Millisecond); err != nil {
				return Unmounted, err
			}
		}
		for i := 0; i < 50; i++ {
			if _, ok := s.Read(mp); !ok {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		return Unmounted, nil
	}
	if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil {
		return Unmounted, fmt.Errorf("unmount %s: signal pid %d: %w", mp, st.PID, err)
	}
	for time.Now().Before(deadline) {
		if _, still := At(mp); !still {
			// Let the process finish its own clean-up (state file).
			for i := 0; i < 50 && proc.Alive(st.PID, ""); i++ {
				time.Sleep(20 * time.Millisecond)
			}
			return Unmounted, nil
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return Unmounted, err
		}
	}
	return Unmounted, fmt.Errorf("unmount %s: pid %d did not unmount within %v", mp, st.PID, timeout)
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
