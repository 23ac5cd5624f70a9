package oci

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"

	"github.com/bdnvol/bdnvol/internal/ratelimit"
)

// ErrNotFound is wrapped when a reference names nothing.
var ErrNotFound = errdef.ErrNotFound

// Target is a repository: a registry repository or an OCI layout.
type Target interface {
	oras.GraphTarget
	registry.TagLister
	content.Deleter
}

// Options configure how a repository is reached. Zero values are secure
// defaults: TLS with the system roots, docker credentials.
type Options struct {
	PlainHTTP          bool   // use plain HTTP (always used for loopback hosts)
	ForceTLS           bool   // use TLS even for loopback hosts
	InsecureSkipVerify bool   // accept any TLS certificate
	CAFile             string // extra PEM roots; SSL_CERT_FILE is honoured too
	UserAgent          string
	// Credentials overrides the docker credential store; nil loads it.
	Credentials credentials.Store
	// CreateLayout lets Open create a missing OCI layout (for pushes).
	CreateLayout bool
	// Retry bounds retries of registry requests.
	Retry RetryPolicy
	// PartSize uploads blobs in PATCH parts of this many bytes; 0 sends each
	// blob in one request, switching to parts when the registry answers 413.
	PartSize int64
	// Limiter paces the bodies of every request and response of the
	// clients built from these options, together (--max-rate: one limiter
	// for the whole command); nil for no bound.
	Limiter *ratelimit.Limiter
}

// Open returns the repository that r names.
func Open(ctx context.Context, r Ref, opt Options) (Target, error) {
	if r.Layout != "" {
		if !opt.CreateLayout {
			if _, err := os.Stat(r.Layout); err != nil {
				return nil, fmt.Errorf("%s: %w", r.Repo(), ErrNotFound)
			}
		}
		s, err := openLayout(ctx, r.Layout, opt.CreateLayout)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.Repo(), err)
		}
		return s, nil
	}
	repo, err := remote.NewRepository(r.Registry + "/" + r.Repository)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.Repo(), err)
	}
	repo.PlainHTTP = !opt.ForceTLS && (opt.PlainHTTP || IsLoopback(r.Registry))
	client, err := NewClient(opt)
	if err != nil {
		return nil, err
	}
	repo.Client = client
	scheme := "https"
	if repo.PlainHTTP {
		scheme = "http"
	}
	reg := &repository{Repository: repo, client: client, base: scheme + "://" + r.Registry}
	reg.partSize.Store(opt.PartSize)
	return reg, nil
}

// NewClient returns an authenticating, retrying HTTP client for registries.
func NewClient(opt Options) (*auth.Client, error) {
	base := baseTransport(2 * time.Minute)
	tlsConf, err := tlsConfig(opt.InsecureSkipVerify, opt.CAFile)
	if err != nil {
		return nil, err
	}
	base.TLSClientConfig = tlsConf
	store := opt.Credentials
	if store == nil {
		s, err := credentials.NewStoreFromDocker(credentials.StoreOptions{AllowPlaintextPut: true, DetectDefaultNativeStore: false})
		if err != nil {
			return nil, fmt.Errorf("docker credentials: %w", err)
		}
		store = s
	}
	c := &auth.Client{
		Client:     &http.Client{Transport: listGuardTransport{NewRetryTransport(ratelimit.Transport(base, opt.Limiter), opt.Retry)}},
		Cache:      auth.NewCache(),
		Credential: credentials.Credential(store),
	}
	ua := opt.UserAgent
	if ua == "" {
		ua = "bdnvol"
	}
	c.SetUserAgent(ua)
	return c, nil
}

// baseTransport is the HTTP transport every client here starts from: many
// idle connections per host, and an answer's headers within headerTimeout.
func baseTransport(headerTimeout time.Duration) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	tr.ResponseHeaderTimeout = headerTimeout
	return tr
}

// tlsConfig is TLS 1.2 or later with the system roots plus the PEM
// certificates in caFiles, or any certificate when skipVerify is set.
func tlsConfig(skipVerify bool, caFiles ...string) (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: skipVerify}
	var pool *x509.CertPool
	for _, p := range caFiles {
		if p == "" {
			continue
		}
		pem, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		if pool == nil {
			if pool, err = x509.SystemCertPool(); err != nil || pool == nil {
				pool = x509.NewCertPool()
			}
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificates", p)
		}
	}
	conf.RootCAs = pool
	return conf, nil
}

// Resolve returns the root descriptor that r names: its digest if it has
// one (checked to exist), else what its tag points to now.
func Resolve(ctx context.Context, t Target, r Ref) (ocispec.Descriptor, error) {
	ref := r.Reference()
	if ref == "" {
		return ocispec.Descriptor{}, fmt.Errorf("%s: no tag or digest", r)
	}
	d, err := t.Resolve(ctx, ref)
	if err != nil {
		if errors.Is(err, errdef.ErrNotFound) {
			return d, fmt.Errorf("%s: %w", r, errdef.ErrNotFound)
		}
		return d, fmt.Errorf("%s: %w", r, err)
	}
	if r.Digest != "" && d.Digest != r.Digest {
		return d, fmt.Errorf("%s: resolved to %s", r, d.Digest)
	}
	return d, nil
}

// ErrMismatchedDigest is wrapped when bytes a target sent do not hash to
// the digest the reference names or the target claims for them.
var ErrMismatchedDigest = content.ErrMismatchedDigest

// ErrManifestTooLarge is wrapped when a manifest is over the size asked for.
var ErrManifestTooLarge = errors.New("manifest too large")

// FetchManifest GETs the manifest r names and returns its descriptor and
// bytes. The digest is computed from the bytes, never taken from the
// target's answer (a registry's Docker-Content-Digest header, which oras-go
// trusts): it must equal r's digest when r has one, and the digest the
// target claims when it claims one, else the error wraps
// ErrMismatchedDigest. A tag resolves to the digest of the bytes it serves.
// A manifest over maxBytes is ErrManifestTooLarge.
func FetchManifest(ctx context.Context, t Target, r Ref, maxBytes int64) (ocispec.Descriptor, []byte, error) {
	ref := r.Reference()
	if ref == "" {
		return ocispec.Descriptor{}, nil, fmt.Errorf("%s: no tag or digest", r)
	}
	var claimed ocispec.Descriptor
	var rc io.ReadCloser
	var err error
	if rf, ok := t.(registry.ReferenceFetcher); ok {
		claimed, rc, err = rf.FetchReference(ctx, ref)
	} else if claimed, err = t.Resolve(ctx, ref); err == nil {
		rc, err = t.Fetch(ctx, claimed)
	}
	if err != nil {
		if errors.Is(err, errdef.ErrNotFound) {
			return ocispec.Descriptor{}, nil, fmt.Errorf("%s: %w", r, errdef.ErrNotFound)
		}
		return ocispec.Descriptor{}, nil, fmt.Errorf("%s: %w", r, err)
	}
	defer rc.Close()
	if claimed.Size > maxBytes {
		return ocispec.Descriptor{}, nil, fmt.Errorf("%s: manifest of %d bytes, over %d: %w", r, claimed.Size, maxBytes, ErrManifestTooLarge)
	}
	b, err := io.ReadAll(io.LimitReader(rc, maxBytes+1))
	if err != nil {
		return ocispec.Descriptor{}, nil, fmt.Errorf("%s: manifest: %w", r, err)
	}
	if int64(len(b)) > maxBytes {
		return ocispec.Descriptor{}, nil, fmt.Errorf("%s: manifest over %d bytes: %w", r, maxBytes, ErrManifestTooLarge)
	}
	want := r.Digest
	if want == "" {
		want = claimed.Digest
	}
	alg := digest.Canonical
	if want != "" {
		if want.Validate() != nil {
			return ocispec.Descriptor{}, nil, fmt.Errorf("%s: claimed digest %q: %w", r, want, ErrMismatchedDigest)
		}
		alg = want.Algorithm()
	}
	got := alg.FromBytes(b)
	if want != "" && got != want {
		return ocispec.Descriptor{}, nil, fmt.Errorf("%s: the manifest served hashes to %s, not %s: %w", r, got, want, ErrMismatchedDigest)
	}
	if claimed.Digest != "" && claimed.Digest != got {
		return ocispec.Descriptor{}, nil, fmt.Errorf("%s: the registry claims %s for a manifest that hashes to %s: %w", r, claimed.Digest, got, ErrMismatchedDigest)
	}
	return ocispec.Descriptor{MediaType: claimed.MediaType, Digest: got, Size: int64(len(b))}, b, nil
}

// TagBytes points tag at the manifest desc whose bytes are b, in one
// request where the target supports it.
func TagBytes(ctx context.Context, t Target, desc ocispec.Descriptor, b []byte, tag string) error {
	if rp, ok := t.(registry.ReferencePusher); ok && b != nil {
		if err := rp.PushReference(ctx, desc, bytes.NewReader(b), tag); err != nil {
			return fmt.Errorf("tag %s as %s: %w", desc.Digest, tag, err)
		}
		return nil
	}
	if err := t.Tag(ctx, desc, tag); err != nil {
		return fmt.Errorf("tag %s as %s: %w", desc.Digest, tag, err)
	}
	return nil
}

// TagRequest is one tag of a batch: Tag is pointed at the manifest Desc,
// whose bytes are Manifest (nil when not at hand).
type TagRequest struct {
	Desc     ocispec.Descriptor
	Manifest []byte
	Tag      string
}

// Batcher is a Target that keeps its tags in one file (an OCI layout's
// index.json), which every Tag and every manifest Push rewrites: a caller
// with many stores the manifests with Store and lists them and moves the
// tags with one Update.
type Batcher interface {
	// Store stores a blob (a manifest too) without listing it.
	Store(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error
	// Update lists the stored manifests list and points each tag of tags
	// at its manifest, in one rewrite; the later of two requests for one
	// tag wins. ctx is checked between requests: cancelled, nothing changes.
	Update(ctx context.Context, list []ocispec.Descriptor, tags []TagRequest) error
}

// TagAll points each tag of tags at its manifest: in one update where t is
// a Batcher, else one request each, ctx checked between them.
func TagAll(ctx context.Context, t Target, tags []TagRequest) error {
	if b, ok := t.(Batcher); ok {
		return b.Update(ctx, nil, tags)
	}
	for _, r := range tags {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := TagBytes(ctx, t, r.Desc, r.Manifest, r.Tag); err != nil {
			return err
		}
	}
	return nil
}
