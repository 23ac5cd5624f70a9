package mounts

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/deploy"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/profile"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// Target is one version to mount at one mountpoint.
type Target struct {
	Ref        oci.Ref
	Mountpoint string
	Policy     signature.Policy
	// Root, when its digest is set, is what Ref resolved to in the process
	// that started this one (Handoff); Open reads its manifest from the
	// cache (origin.Options.Known).
	Root ocispec.Descriptor
	// Profile, when set, waits for the startup profile lookup the
	// process that started this one did for Root (profile.Options.Handed);
	// false when it has none to hand.
	Profile func(context.Context) (profile.Lookup, bool)
}

// FromSpec reads the deploy file specFile and places its mounts under the
// directory root. A mount whose deploy file names no key requires a
// signature by defaultKey ("" for none); a relative key is relative to the
// deploy file. warn (if not nil) is told of each mount the file does not
// ask to be read-only.
func FromSpec(specFile, root, defaultKey string, warn func(format string, args ...any)) ([]Target, error) {
	b, err := os.ReadFile(specFile)
	if err != nil {
		return nil, err
	}
	spec, err := deploy.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", specFile, err)
	}
	placed, err := spec.Targets(root)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", specFile, err)
	}
	var out []Target
	for i, m := range placed {
		key := spec.SignatureKey(i)
		if key == "" {
			key = defaultKey
		} else if !filepath.IsAbs(key) {
			key = filepath.Join(filepath.Dir(specFile), key)
		}
		policy, err := signature.LoadPolicy(key)
		if err != nil {
			return nil, fmt.Errorf("%s: mount %s: %w", specFile, m.Path, err)
		}
		if !m.ReadOnly && warn != nil {
			warn("%s: %s is mounted read-only (bdnvol mounts are always read-only)", specFile, m.Path)
		}
		out = append(out, Target{Ref: m.Ref, Mountpoint: m.Mountpoint, Policy: policy})
	}
	return out, nil
}

// Prepare makes each target's mountpoint ready: created when mkdir is set
// (a spec's mountpoints), and cleared of a stale mount left by a process
// that died.
func Prepare(store Store, targets []Target, mkdir bool, logf func(format string, args ...any)) error {
	for _, t := range targets {
		if mkdir {
			if err := os.MkdirAll(t.Mountpoint, 0o755); err != nil && !NotConnected(t.Mountpoint) {
				return fmt.Errorf("mountpoint: %w", err)
			}
		}
		if err := store.Clear(t.Mountpoint, logf); err != nil {
			return err
		}
	}
	return nil
}

// RunOptions configure Run.
type RunOptions struct {
	// Open opens each version; its Policy is replaced by the target's.
	Open OpenOptions
	// Serve serves each version; its CacheDir is Open.Cache's directory.
	Serve ServeOptions
	// Prefetch is started on every version once all are served; nil
	// prefetches nothing. PrefetchName names it when it is done (not
	// reported for "headers").
	Prefetch     func(context.Context, *lazy.Volume) error
	PrefetchName string
	// Hold (if set) is called for each served version; the function it
	// returns is called when Run returns.
	Hold func(*Served) func()
	// Ready (if set) is told of every mount once all are served.
	Ready func([]*Served)
}

// Run opens and mounts every target, then serves them until every mount is
// gone or ctx is done; then it unmounts what is left. A target that fails
// to mount unmounts the ones before it.
func Run(ctx context.Context, targets []Target, opt RunOptions) error {
	logf := opt.Serve.logf
	var all []*Served
	defer func() {
		for _, s := range all {
			s.Volume.Close()
		}
	}()
	for _, t := range targets {
		s, err := runOne(ctx, t, opt)
		if err != nil {
			for _, s := range all {
				s.Unmount()
			}
			return err
		}
		all = append(all, s)
	}
	if opt.Hold != nil {
		for _, s := range all {
			release := opt.Hold(s)
			defer release()
		}
	}
	if opt.Ready != nil {
		opt.Ready(all)
	}

	var wg sync.WaitGroup
	pctx, stopPrefetch := context.WithCancel(ctx)
	defer func() { stopPrefetch(); wg.Wait() }()
	if opt.Prefetch != nil {
		for _, s := range all {
			wg.Go(func() {
				start := time.Now()
				if err := opt.Prefetch(pctx, s.Volume); err != nil && pctx.Err() == nil {
					logf("prefetch %s: %s", termsafe.Text(s.Mountpoint), termsafe.Text(err.Error()))
				} else if err == nil && opt.PrefetchName != "headers" {
					logf("prefetch %s of %s done in %.1fs", opt.PrefetchName, s.Mountpoint, time.Since(start).Seconds())
				}
			})
		}
	}

	// Serve until every mount is gone or ctx asks to stop.
	if !Wait(ctx, all, func(s *Served) { logf("%s was unmounted", s.Mountpoint) }) {
		return nil
	}
	stopPrefetch()
	return UnmountAll(all, func(s *Served) { logf("unmounted %s", s.Mountpoint) })
}

// runOne resolves t's reference, opens the version and mounts it.
func runOne(ctx context.Context, t Target, opt RunOptions) (*Served, error) {
	if t.Ref.Layout != "" && len(opt.Open.Mirrors.URLs) > 0 {
		opt.Serve.logf("%s is a local layout; mirrors are not used", t.Ref.Repo())
	}
	o := opt.Open
	o.Policy = t.Policy
	o.Known = t.Root
	if t.Profile != nil {
		o.Profile.Handed = t.Profile
	}
	vol, pinned, err := Open(ctx, t.Ref, o)
	if err != nil {
		return nil, err
	}
	so := opt.Serve
	if o.Cache != nil {
		so.CacheDir = o.Cache.Dir()
	}
	s, err := Serve(t.Mountpoint, vol, pinned, so)
	if err != nil {
		vol.Close()
		return nil, err
	}
	return s, nil
}
