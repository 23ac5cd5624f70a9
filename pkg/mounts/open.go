package mounts

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// MirrorConfig chooses registry mirrors for content fetched by digest.
type MirrorConfig struct {
	URLs       []string // mirrors to try first, in order
	HostsDir   string   // containerd-style hosts directory; "" uses oci.DefaultHostsDir when it exists, "none" disables
	CAFile     string   // extra roots for the mirrors given by URL
	SkipVerify bool     // accept any certificate from the mirrors given by URL
	// OnError is told about each failed mirror request; nil ignores them.
	OnError func(mirror string, desc ocispec.Descriptor, err error)
}

// Check reports a malformed mirror URL.
func (m MirrorConfig) Check() error {
	for _, u := range m.URLs {
		if _, err := oci.ParseMirrorURL(u); err != nil {
			return err
		}
	}
	return nil
}

// mirrorTimeout bounds how long a mirror may take to answer before the
// next one, or the registry, is tried.
const mirrorTimeout = 5 * time.Second

// Fetcher returns src wrapped with the mirrors configured for ref's
// registry, and the mirror fetcher (nil when there are none). A local
// layout has no mirrors.
func (m MirrorConfig) Fetcher(ref oci.Ref, src content.Fetcher) (content.Fetcher, *oci.MirrorFetcher, error) {
	if ref.Layout != "" {
		return src, nil, nil
	}
	var hosts []oci.HostEntry
	for _, u := range m.URLs {
		h := oci.HostEntry{URL: u, SkipVerify: m.SkipVerify}
		if m.CAFile != "" {
			h.CA = []string{m.CAFile}
		}
		hosts = append(hosts, h)
	}
	dir := m.HostsDir
	if dir == "" {
		if _, err := os.Stat(oci.DefaultHostsDir); err == nil {
			dir = oci.DefaultHostsDir
		}
	}
	if dir != "" && dir != "none" {
		cfg, err := oci.LoadHostsConfig(dir, ref.Registry)
		if err != nil {
			return nil, nil, err
		}
		hosts = append(hosts, cfg.Mirrors(ref.Registry)...)
	}
	if len(hosts) == 0 {
		return src, nil, nil
	}
	mirrors := make([]oci.Mirror, 0, len(hosts))
	for _, h := range hosts {
		mr, err := h.Mirror(mirrorTimeout)
		if err != nil {
			return nil, nil, err
		}
		mirrors = append(mirrors, mr)
	}
	onError := m.OnError
	if onError == nil {
		onError = func(string, ocispec.Descriptor, error) {}
	}
	mf, err := oci.NewMirrorFetcher(src, mirrors, oci.MirrorOptions{
		Registry:     ref.Registry,
		Repository:   ref.Repository,
		MaxBlobBytes: layout.MaxChunkBytes,
		Timeout:      mirrorTimeout,
		OnError:      onError,
	})
	if err != nil {
		return nil, nil, err
	}
	return mf, mf, nil
}

// OpenOptions configure Open.
type OpenOptions struct {
	OCI          oci.Options
	Mirrors      MirrorConfig
	Cache        *chunkcache.Cache
	Jobs         int
	FetchTimeout time.Duration
	// Wrap, when set, wraps the registry's fetcher (source "registry",
	// host the registry), for metrics.
	Wrap func(source, host string, f content.Fetcher) content.Fetcher
	// Policy is checked right after the reference is resolved, before any
	// of the version is read.
	Policy signature.Policy
}

// Open resolves ref (a tag becomes a digest now) and opens the version it
// names for lazy reading. It returns the volume and its pinned reference.
func Open(ctx context.Context, ref oci.Ref, opt OpenOptions) (*lazy.Volume, string, error) {
	t, err := oci.Open(ctx, ref, opt.OCI)
	if err != nil {
		return nil, "", err
	}
	// The manifest comes with the resolution (one round trip, not two):
	// it goes into the cache, where the volume reads it.
	desc, b, err := signature.ResolveBytes(ctx, t, ref, opt.Policy, layout.MaxManifestBytes)
	if err != nil {
		return nil, "", err
	}
	if b != nil && opt.Cache != nil {
		if ch, err := opt.Cache.Load(ctx, bytesFetcher(b), desc); err == nil {
			ch.Close()
		}
	}
	var reg content.Fetcher = t
	if opt.Wrap != nil && ref.Layout == "" {
		reg = opt.Wrap("registry", ref.Registry, reg)
	}
	src, _, err := opt.Mirrors.Fetcher(ref, reg)
	if err != nil {
		return nil, "", err
	}
	vol, err := lazy.Open(ctx, src, desc, lazy.Options{Cache: opt.Cache, Jobs: opt.Jobs, FetchTimeout: opt.FetchTimeout})
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", ref, err)
	}
	return vol, ref.Pinned(desc.Digest), nil
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

// OncePerMirror returns a MirrorConfig.OnError that tells f of the first
// failure of each mirror only.
func OncePerMirror(f func(mirror string, err error)) func(string, ocispec.Descriptor, error) {
	var seen sync.Map
	return func(mirror string, _ ocispec.Descriptor, err error) {
		if _, dup := seen.LoadOrStore(mirror, true); !dup {
			f(mirror, err)
		}
	}
}

// bytesFetcher serves one blob whose bytes are already here; the cache
// verifies them against the descriptor it asks for.
type bytesFetcher []byte

func (b bytesFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b)), nil
}
