package mounts

import (
	"context"
	"fmt"
	"os"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/profile"
)

// RecordOptions configure Record.
type RecordOptions struct {
	// Open opens the version; its Profile and Recorder are replaced (no
	// profile is replayed while one is recorded).
	Open OpenOptions
	// Serve serves it; no mount state is written.
	Serve ServeOptions
	// Window bounds the start window.
	Window profile.Window
	// Run is the workload, given the mountpoint; its context is cancelled
	// when the window closes before it returns.
	Run func(ctx context.Context, mountpoint string) error
}

// Recorded is the outcome of Record.
type Recorded struct {
	Profile *profile.Profile
	Pinned  string // the digest-pinned reference recorded
	// Stopped says the window closed (reads paused, or a bound) before
	// the workload returned, which was then stopped.
	Stopped bool
}

// Record mounts the version ref names on a fresh directory, runs the
// workload on it and records the chunks it reads, in first-read order,
// until the workload returns or the window closes. A workload that fails
// on its own fails the recording.
func Record(ctx context.Context, ref oci.Ref, opt RecordOptions) (*Recorded, error) {
	rec := profile.NewRecorder(opt.Window)
	o := opt.Open
	o.Profile, o.Recorder = profile.Options{}, rec
	vol, pinned, err := Open(ctx, ref, o)
	if err != nil {
		return nil, err
	}
	defer vol.Close()
	mp, err := os.MkdirTemp("", "bdnvol-profile-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(mp)
	so := opt.Serve
	so.Store = nil
	s, err := Serve(mp, vol, pinned, so)
	if err != nil {
		return nil, err
	}
	defer s.Unmount()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() {
		ran <- opt.Run(rctx, mp) // before Stop: Wait's return then finds it
		rec.Stop()
	}()
	if err := rec.Wait(ctx); err != nil {
		stop()
		<-ran
		return nil, err
	}
	var runErr error
	stopped := false
	select {
	case runErr = <-ran:
	default:
		stopped = true
		stop()
		<-ran // stopped by us: its error is ours
	}
	if runErr != nil {
		return nil, fmt.Errorf("workload: %w", runErr)
	}
	return &Recorded{Profile: rec.Profile(vol.Version()), Pinned: pinned, Stopped: stopped}, nil
}
