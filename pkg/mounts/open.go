package mounts

import (
	"context"
	"fmt"
	"sync"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/modelpack"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/origin"
	"github.com/bdnvol/bdnvol/pkg/profile"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// OpenOptions configure Open.
type OpenOptions struct {
	OCI          oci.Options
	Mirrors      oci.MirrorConfig
	Cache        *chunkcache.Cache
	Jobs         int
	FetchTimeout time.Duration
	// Wrap, when set, wraps the registry's fetcher (source "registry",
	// host the registry), for metrics.
	Wrap func(source, host string, f content.Fetcher) content.Fetcher
	// Policy is checked right after the reference is resolved, before any
	// of the version is read.
	Policy signature.Policy
	// Profile says where the version's startup profile is looked for
	// (replayed ahead of readers) and whether one is recorded; the zero
	// value uses none.
	Profile profile.Options
	// Recorder, when set, is told every chunk a read touches (bdnvol
	// profile record).
	Recorder *profile.Recorder
	// IndexTrust holds the keys whose signature on an index published
	// beside a ModelPack model is trusted (modelpack.WithTrust), so that
	// the first open on a machine does not read every layer; when it has
	// none, Policy's keys are.
	IndexTrust signature.Policy
	// Logf, when set, is told what the open did that an operator may ask
	// about (a ModelPack model read whole for want of a trusted index).
	Logf func(format string, args ...any)
	// Peers, when set, puts the cluster's peers in front of the registry
	// (origin.Options.Peers).
	Peers func(ref oci.Ref, src content.Fetcher) content.Fetcher
	// Known is the root the reference resolved to in another process
	// (origin.Options.Known); Run sets it from Target.Root.
	Known ocispec.Descriptor
}

// Open resolves ref (a tag becomes a digest now) and opens the version it
// names for lazy reading. It returns the volume and its pinned reference.
func Open(ctx context.Context, ref oci.Ref, opt OpenOptions) (*lazy.Volume, string, error) {
	o, err := origin.Resolve(ctx, ref, origin.Options{OCI: opt.OCI, Mirrors: opt.Mirrors, Policy: opt.Policy, Wrap: opt.Wrap, Preload: opt.Cache, Peers: opt.Peers, Known: opt.Known})
	if err != nil {
		return nil, "", err
	}
	lo := lazy.Options{Jobs: opt.Jobs, FetchTimeout: opt.FetchTimeout}
	if opt.Cache != nil {
		// What the mount reads from the cache its own origin delivered
		// (chunkcache's origin rule).
		lo.Cache = opt.Cache.For(o.Name())
	}
	rec := opt.Recorder
	var auto *profile.Recorder
	if rec == nil && opt.Profile.Mode == profile.ModeAuto && opt.Profile.Store.Dir != "" {
		auto = profile.NewRecorder(opt.Profile.Record)
		rec = auto
	}
	if rec != nil {
		lo.OnRead = rec.Read
	}
	trust := opt.IndexTrust
	if !trust.Required() {
		trust = opt.Policy
	}
	ctx = modelpack.WithTrust(ctx, modelpack.Trust{Target: o.Target, Policy: trust, Logf: opt.Logf})
	scoped, _ := o.Fetcher.(origin.Scoped) // the peer tier's: it serves this mount until the volume closes
	if scoped != nil {
		lo.OnClose = func() { scoped.Close() }
	}
	vol, err := lazy.Open(ctx, o.Fetcher, o.Root, lo)
	if err != nil {
		if scoped != nil {
			scoped.Close()
		}
		return nil, "", fmt.Errorf("%s: %w", ref, err)
	}
	if scoped != nil {
		scoped.Opened(vol.Version())
	}
	profile.Start(vol, o.Target, auto, opt.Profile)
	return vol, o.Pinned(), nil
}

// Prefetcher turns a --prefetch value (none, headers, all, or
// comma-separated globs, see lazy.ParseGlobs) into the background work to
// start; nil for none.
func Prefetcher(s string) (func(context.Context, *lazy.Volume) error, error) {
	switch s {
	case "none", "":
		return nil, nil
	case "headers":
		return func(ctx context.Context, v *lazy.Volume) error { return v.PrefetchHeaders(ctx) }, nil
	case "all":
		return func(ctx context.Context, v *lazy.Volume) error {
			if err := v.PrefetchHeaders(ctx); err != nil {
				return err
			}
			return v.Prefetch(ctx, nil)
		}, nil
	}
	g, err := lazy.ParseGlobs(s)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, v *lazy.Volume) error {
		if err := v.PrefetchHeaders(ctx); err != nil {
			return err
		}
		if err := v.Prefetch(ctx, g.Match); err != nil {
			return err
		}
		return g.Err()
	}, nil
}

// Preload fetches what opening each target reads first, its manifest and
// its file index, into cache, the targets concurrently, so that an Open
// through the same cache directory (another process: `mount --daemon`'s
// daemon, started meanwhile) finds them there instead of waiting on the
// link for them. Each target's policy is checked first, as Open checks it;
// every byte is verified by the cache; only a bdnvol volume's index is
// read (a ModelPack model is left to Open, which may read it whole).
// Errors are dropped: Open meets them again and reports them. At most
// maxPreloads targets load at once. It returns the targets whose version
// was loaded, each with its Root set, for the daemon (Handoff).
//
// In opt.Profile's auto mode, each version's profile referrer is looked
// for as soon as its root is known, beside the index (profile.Look), when
// the node's store has no profile of it: the Profile of a returned target
// waits for that lookup, which goes on after Preload returns, until it is
// done or ctx ends.
func Preload(ctx context.Context, targets []Target, cache *chunkcache.Cache, opt OpenOptions) []Target {
	if cache == nil {
		return nil
	}
	var mu sync.Mutex
	var loaded []Target
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxPreloads)
	lookSem := make(chan struct{}, maxPreloads)
	for _, t := range targets {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-ctx.Done():
				return
			}
			o, err := origin.Resolve(ctx, t.Ref, origin.Options{OCI: opt.OCI, Mirrors: opt.Mirrors, Policy: t.Policy, Preload: cache})
			if err != nil {
				return
			}
			look := lookProfile(ctx, o.Target, o.Root, opt.Profile, lookSem)
			if _, err := layout.Open(ctx, cache.For(o.Name()).Fetcher(o.Fetcher), o.Root); err != nil {
				return
			}
			t.Root = o.Root
			t.Profile = look
			mu.Lock()
			loaded = append(loaded, t)
			mu.Unlock()
		})
	}
	wg.Wait()
	return loaded
}

// lookProfile starts looking for the profile referrer of the version
// whose root is root in t (profile.Look), at most cap(sem) at once, when
// opt asks for one from a referrer; it returns what waits for the outcome
// (nil: nothing is looked for).
func lookProfile(ctx context.Context, t oci.Target, root ocispec.Descriptor, opt profile.Options, sem chan struct{}) func(context.Context) (profile.Lookup, bool) {
	if opt.Mode != profile.ModeAuto || t == nil {
		return nil
	}
	if opt.Store.Dir != "" {
		if _, err := opt.Store.Load(root.Digest); err == nil {
			return nil // the daemon replays the node's own
		}
	}
	var l profile.Lookup
	var ok bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
		case <-ctx.Done():
			return
		}
		l, ok = profile.Look(ctx, t, root)
	}()
	return func(wctx context.Context) (profile.Lookup, bool) {
		select {
		case <-done:
			return l, ok
		case <-wctx.Done():
			return profile.Lookup{}, false
		}
	}
}

// maxPreloads bounds the targets Preload loads at once.
const maxPreloads = 8
