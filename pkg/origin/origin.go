package origin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/modelpack"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// Options configure Resolve. The zero value opens the target with default
// transport options, requires no signature, wraps nothing and preloads
// nothing.
type Options struct {
	OCI     oci.Options
	Mirrors oci.MirrorConfig
	// Policy is checked right after the reference is resolved, before any
	// of the version is read.
	Policy signature.Policy
	// Wrap, when set, wraps the registry's fetcher (source "registry",
	// host the registry), for metrics. A local layout is not wrapped.
	Wrap func(source, host string, f content.Fetcher) content.Fetcher
	// Preload, when set, receives the manifest the resolution fetched
	// (verified against the root by the cache, and recorded as delivered
	// by the reference's repository), so that opening the version through
	// the cache's view of that repository reads it from there.
	Preload *chunkcache.Cache
	// Peers, when set, puts the cluster's peers in front of a registry
	// reference's source (the registry behind its mirrors): it gets that
	// source and returns the fetcher to read through (pkg/peer). When
	// that fetcher is a Scoped, the caller tells it the version it opened
	// and closes it when done with it.
	Peers func(ref oci.Ref, src content.Fetcher) content.Fetcher
	// Known, when its digest is set, is the root ref resolved to moments
	// ago in another process (`mount --daemon`'s first process, see
	// mounts.Preload). When Preload holds that manifest as delivered by
	// ref's repository, Resolve reads it from there instead of asking the
	// registry: the cache verifies its bytes against the digest, and the
	// policy is checked as ever. Ignored when ref names another digest.
	Known ocispec.Descriptor
}

// Scoped is a fetcher that serves one use of a version (a mount, a pull):
// Opened tells it the version opened through it (the peer tier then
// fetches that version's chunks for its peers), Close that the use ended.
type Scoped interface {
	Opened(ver *layout.Version)
	Close() error
}

// Origin is where one resolved version is read from.
type Origin struct {
	Ref    oci.Ref            // as given
	Target oci.Target         // the registry or layout ref names
	Root   ocispec.Descriptor // the version's root, its digest computed from its bytes
	// Fetcher reads the version's blobs: the target, wrapped by
	// Options.Wrap, behind the mirrors. No chunk cache is in front of it.
	Fetcher content.Fetcher
	// Mirrors is the mirror fetcher within Fetcher, for its statistics;
	// nil when ref's registry has no mirror.
	Mirrors *oci.MirrorFetcher
}

// Name names the origin as the chunk cache records it (chunkcache.For):
// the registry and repository, or the layout's path.
func (o *Origin) Name() string { return o.Ref.Repo() }

// Pinned returns the reference pinned to the resolved digest.
func (o *Origin) Pinned() string { return o.Ref.Pinned(o.Root.Digest) }

// Resolve opens the target ref names, resolves ref there under opt.Policy
// and builds the fetcher its blobs are read through.
func Resolve(ctx context.Context, ref oci.Ref, opt Options) (*Origin, error) {
	t, err := oci.Open(ctx, ref, opt.OCI)
	if err != nil {
		return nil, err
	}
	desc, b, known := cachedRoot(ctx, ref, opt)
	if known {
		if err := opt.Policy.Check(ctx, t, desc); err != nil {
			return nil, fmt.Errorf("%s: %w", ref.Pinned(desc.Digest), err)
		}
	} else if desc, b, err = signature.ResolveBytes(ctx, t, ref, opt.Policy, oci.MaxManifestBytes); err != nil {
		// The manifest comes with the resolution (one round trip, not two).
		return nil, err
	}
	if b != nil && opt.Preload != nil && !known {
		if ch, err := opt.Preload.For(ref.Repo()).Load(ctx, bytesFetcher(b), desc); err == nil {
			ch.Close()
		}
	}
	var reg content.Fetcher = t
	if opt.Wrap != nil && ref.Layout == "" {
		reg = opt.Wrap("registry", ref.Registry, reg)
	}
	src, mirrors, err := opt.Mirrors.Fetcher(ref, reg)
	if err != nil {
		return nil, err
	}
	if opt.Peers != nil && ref.Layout == "" {
		src = opt.Peers(ref, src)
	}
	return &Origin{Ref: ref, Target: t, Root: desc, Fetcher: src, Mirrors: mirrors}, nil
}

// cachedRoot returns opt.Known and its manifest when opt.Preload holds it
// as delivered by ref's repository (chunkcache's origin rule), verified.
func cachedRoot(ctx context.Context, ref oci.Ref, opt Options) (ocispec.Descriptor, []byte, bool) {
	k := opt.Known
	if k.Digest == "" || opt.Preload == nil || k.Size <= 0 || k.Size > oci.MaxManifestBytes ||
		(ref.Digest != "" && ref.Digest != k.Digest) || k.Digest.Validate() != nil {
		return ocispec.Descriptor{}, nil, false
	}
	ch, err := opt.Preload.For(ref.Repo()).Load(ctx, notFetched{}, k)
	if err != nil {
		return ocispec.Descriptor{}, nil, false
	}
	defer ch.Close()
	b := make([]byte, k.Size)
	if _, err := ch.ReadAt(b, 0); err != nil {
		return ocispec.Descriptor{}, nil, false
	}
	return k, b, true
}

// notFetched fetches nothing: a cache load through it serves only what is
// cached.
type notFetched struct{}

func (notFetched) Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error) {
	return nil, errNotCached
}

var errNotCached = errors.New("not cached")

// bytesFetcher serves one blob whose bytes are already here; the cache
// verifies them against the descriptor it asks for.
type bytesFetcher []byte

func (b bytesFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b)), nil
}

// Formats are the formats other than bdnvol's that Open reads as versions:
// ModelPack models.
var Formats = []layout.ForeignFormat{modelpack.Format}

// Open opens the version whose root is desc from src: a bdnvol volume, or
// an artifact of one of Formats.
func Open(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (*layout.Version, error) {
	return OpenWith(ctx, src, desc, layout.OpenOptions{})
}

// OpenWith is Open with options (their Foreign replaced by Formats).
func OpenWith(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor, opt layout.OpenOptions) (*layout.Version, error) {
	opt.Foreign = Formats
	return layout.OpenWith(ctx, src, desc, opt)
}

// IsForeign reports whether an image manifest of artifactType (and config
// media type configType) is of one of Formats.
func IsForeign(artifactType, configType string) bool {
	for _, f := range Formats {
		if f.Reads(artifactType, configType) {
			return true
		}
	}
	return false
}
