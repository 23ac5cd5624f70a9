package mounts

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/oci"
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

// bytesFetcher serves one blob whose bytes are already here; the cache
// verifies them against the descriptor it asks for.
type bytesFetcher []byte

func (b bytesFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b)), nil
}
