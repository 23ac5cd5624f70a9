package oci

import (
	"os"
	"sync"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/ratelimit"
)

// MirrorConfig chooses registry mirrors for content fetched by digest.
type MirrorConfig struct {
	URLs       []string // mirrors to try first, in order
	HostsDir   string   // containerd-style hosts directory; "" uses DefaultHostsDir when it exists, "none" disables
	CAFile     string   // extra roots for the mirrors given by URL
	SkipVerify bool     // accept any certificate from the mirrors given by URL
	// OnError is told about each failed mirror request; nil ignores them.
	OnError func(mirror string, desc ocispec.Descriptor, err error)
	// Limiter paces the mirrors' bodies (with the registry's, when shared);
	// nil for no bound.
	Limiter *ratelimit.Limiter
}

// Check reports a malformed mirror URL.
func (m MirrorConfig) Check() error {
	for _, u := range m.URLs {
		if _, err := ParseMirrorURL(u); err != nil {
			return err
		}
	}
	return nil
}

// mirrorTimeout bounds how long a mirror may take to answer before the
// next one, or the registry, is tried.
const mirrorTimeout = 5 * time.Second

// mirrorMaxBlobBytes is the largest blob asked of a mirror: the largest
// chunk of the volume format (layout.MaxChunkBytes).
const mirrorMaxBlobBytes = 256 << 20

// Fetcher returns src wrapped with the mirrors configured for ref's
// registry, and the mirror fetcher (nil when there are none). A local
// layout has no mirrors.
func (m MirrorConfig) Fetcher(ref Ref, src content.Fetcher) (content.Fetcher, *MirrorFetcher, error) {
	if ref.Layout != "" {
		return src, nil, nil
	}
	var hosts []HostEntry
	for _, u := range m.URLs {
		h := HostEntry{URL: u, SkipVerify: m.SkipVerify}
		if m.CAFile != "" {
			h.CA = []string{m.CAFile}
		}
		hosts = append(hosts, h)
	}
	dir := m.HostsDir
	if dir == "" {
		if _, err := os.Stat(DefaultHostsDir); err == nil {
			dir = DefaultHostsDir
		}
	}
	if dir != "" && dir != "none" {
		cfg, err := LoadHostsConfig(dir, ref.Registry)
		if err != nil {
			return nil, nil, err
		}
		hosts = append(hosts, cfg.Mirrors(ref.Registry)...)
	}
	if len(hosts) == 0 {
		return src, nil, nil
	}
	mirrors := make([]Mirror, 0, len(hosts))
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
	mf, err := NewMirrorFetcher(src, mirrors, MirrorOptions{
		Registry:     ref.Registry,
		Repository:   ref.Repository,
		MaxBlobBytes: mirrorMaxBlobBytes,
		Timeout:      mirrorTimeout,
		OnError:      onError,
		Limiter:      m.Limiter,
	})
	if err != nil {
		return nil, nil, err
	}
	return mf, mf, nil
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
