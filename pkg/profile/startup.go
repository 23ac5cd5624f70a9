package profile

import (
	"context"
	"errors"
	"fmt"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// Profile modes (see Options.Mode).
const (
	ModeAuto = "auto"
	ModeOff  = "off"
)

// Options say where a mount or a warm looks for the startup profile of its
// version, and whether a mount records one.
type Options struct {
	// Mode is ModeOff or "" (no profile), ModeAuto (the node's
	// store, then a referrer of the version; with none, the mount
	// records one into the store), or the path of a profile file.
	Mode string
	// Store is the node's profile store; with no Dir, auto mode looks
	// only at referrers and records nothing.
	Store Store
	// Record bounds the window of a profile recorded in auto mode.
	Record Window
	// Logf (if set) is told what was replayed or recorded.
	Logf func(format string, args ...any)
	// Handed (if set) waits for the referrer lookup another process
	// did for this mount (Look), which auto mode then uses instead of
	// asking the registry; false when there is none (the mount asks).
	Handed func(ctx context.Context) (Lookup, bool)
}

// CheckMode refuses a profile mode that is neither off, auto nor a
// readable profile file.
func CheckMode(mode string) error {
	if mode == "" || mode == ModeAuto || mode == ModeOff {
		return nil
	}
	_, err := ReadFile(mode)
	return err
}

// Find returns the profile opt.Mode selects for the version whose root is
// root in t (nil: no referrer looked at), and where it came from;
// ErrNotFound-wrapping when there is none (or the mode is off).
func Find(ctx context.Context, t oci.Target, root ocispec.Descriptor, opt Options) (*Profile, string, error) {
	switch opt.Mode {
	case ModeOff, "":
		return nil, "", ErrNotFound
	case ModeAuto:
	default:
		p, err := ReadFile(opt.Mode)
		return p, opt.Mode, err
	}
	if opt.Store.Dir != "" {
		p, err := opt.Store.Load(root.Digest)
		if err == nil {
			return p, opt.Store.Path(root.Digest), nil
		}
		if !errors.Is(err, ErrNotFound) {
			opt.logf("profile of %s: %s", root.Digest, termsafe.Text(err.Error()))
		}
	}
	if t == nil {
		return nil, "", ErrNotFound
	}
	if opt.Handed != nil {
		if l, ok := opt.Handed(ctx); ok && l.Version == root.Digest {
			p, err := l.result(root.Digest)
			return p, "referrer", err
		}
	}
	p, err := Fetch(ctx, t, root)
	return p, "referrer", err
}

// Volume is a mounted version as a profile is replayed into it: a
// lazy.Volume.
type Volume interface {
	Root() ocispec.Descriptor
	Version() *layout.Version
	// LoadChunks fetches chunks ks of the version into the cache, the
	// volume's jobs at a time.
	LoadChunks(ctx context.Context, ks []int) error
	// Go runs fn in the background until the volume is unmounted.
	Go(fn func(ctx context.Context))
}

// Start replays the profile of vol's version in the background, ahead of
// any reader, or, in auto mode with no profile, records one into the
// store through rec (nil: record nothing).
func Start(vol Volume, t oci.Target, rec *Recorder, opt Options) {
	if opt.Mode == ModeOff || opt.Mode == "" {
		return
	}
	vol.Go(func(ctx context.Context) {
		start := time.Now()
		root := vol.Root()
		p, from, err := Find(ctx, t, root, opt)
		if err == nil {
			if rec != nil {
				rec.Stop()
			}
			n, err := Replay(ctx, vol, p)
			if err != nil && ctx.Err() == nil {
				opt.logf("profile of %s from %s: %s", root.Digest, termsafe.Text(from), termsafe.Text(err.Error()))
			} else if err == nil {
				opt.logf("profile of %s from %s: %d chunks fetched in %.2fs", root.Digest, termsafe.Text(from), n, time.Since(start).Seconds())
			}
			return
		}
		if !errors.Is(err, ErrNotFound) && ctx.Err() == nil {
			opt.logf("profile of %s not used: %s", root.Digest, termsafe.Text(err.Error()))
		}
		if rec == nil {
			return
		}
		if rec.Wait(ctx) != nil {
			return // unmounted before reads paused: not a whole start
		}
		if got := rec.Profile(vol.Version()); len(got.Chunks) > 0 {
			if err := opt.Store.Save(got); err != nil {
				opt.logf("profile of %s not saved: %s", root.Digest, termsafe.Text(err.Error()))
			} else {
				opt.logf("profile of %s recorded: %d chunks, in %s", root.Digest, len(got.Chunks), opt.Store.Path(root.Digest))
			}
		}
	})
}

// Replay fetches the chunks of vol's version that p lists, in p's order,
// with the volume's jobs in flight, and returns how many it asked for. A
// profile of another version is refused (ErrOtherVersion) and fetches
// nothing.
func Replay(ctx context.Context, vol Volume, p *Profile) (int, error) {
	ks, err := p.Order(vol.Version())
	if err != nil {
		return 0, err
	}
	if err := vol.LoadChunks(ctx, ks); err != nil {
		return len(ks), fmt.Errorf("replay: %w", err)
	}
	return len(ks), nil
}

func (o Options) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}
