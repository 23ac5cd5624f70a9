package mounts

import (
	"context"
	"errors"
	"fmt"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/profile"
)

// Profile modes (see ProfileOptions.Mode).
const (
	ProfileAuto = "auto"
	ProfileOff  = "off"
)

// ProfileOptions say where a mount looks for the startup profile of its
// version, and whether it records one.
type ProfileOptions struct {
	// Mode is ProfileOff or "" (no profile), ProfileAuto (the node's
	// store, then a referrer of the version; with none, the mount
	// records one into the store), or the path of a profile file.
	Mode string
	// Store is the node's profile store; with no Dir, auto mode looks
	// only at referrers and records nothing.
	Store profile.Store
	// Record bounds the window of a profile recorded in auto mode.
	Record profile.Window
	// Logf (if set) is told what was replayed or recorded.
	Logf func(format string, args ...any)
}

// CheckProfileMode refuses a profile mode that is neither off, auto nor
// a readable profile file.
func CheckProfileMode(mode string) error {
	if mode == "" || mode == ProfileAuto || mode == ProfileOff {
		return nil
	}
	_, err := profile.ReadFile(mode)
	return err
}

// FindProfile returns the profile mode selects for the version whose root
// is root in t, and where it came from; ErrNotFound-wrapping when there
// is none (or mode is off).
func FindProfile(ctx context.Context, t oci.Target, root ocispec.Descriptor, opt ProfileOptions) (*profile.Profile, string, error) {
	switch opt.Mode {
	case ProfileOff, "":
		return nil, "", profile.ErrNotFound
	case ProfileAuto:
	default:
		p, err := profile.ReadFile(opt.Mode)
		return p, opt.Mode, err
	}
	if opt.Store.Dir != "" {
		p, err := opt.Store.Load(root.Digest)
		if err == nil {
			return p, opt.Store.Path(root.Digest), nil
		}
		if !errors.Is(err, profile.ErrNotFound) {
			opt.logf("profile of %s: %s", root.Digest, termsafe.Text(err.Error()))
		}
	}
	if t == nil {
		return nil, "", profile.ErrNotFound
	}
	p, err := profile.Fetch(ctx, t, root)
	return p, "referrer", err
}

// startProfile replays the profile of vol's version in the background,
// ahead of any reader, or, in auto mode with no profile, records one into
// the store through rec (nil: record nothing).
func startProfile(vol *lazy.Volume, t oci.Target, rec *profile.Recorder, opt ProfileOptions) {
	if opt.Mode == ProfileOff || opt.Mode == "" {
		return
	}
	vol.Go(func(ctx context.Context) {
		start := time.Now()
		root := vol.Root()
		p, from, err := FindProfile(ctx, t, root, opt)
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
		if !errors.Is(err, profile.ErrNotFound) && ctx.Err() == nil {
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
// profile of another version is refused (profile.ErrOtherVersion) and
// fetches nothing.
func Replay(ctx context.Context, vol *lazy.Volume, p *profile.Profile) (int, error) {
	ks, err := p.Order(vol.Version())
	if err != nil {
		return 0, err
	}
	if err := vol.LoadChunks(ctx, ks); err != nil {
		return len(ks), fmt.Errorf("replay: %w", err)
	}
	return len(ks), nil
}

func (o ProfileOptions) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}
