package oci

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/ratelimit"
	"github.com/bdnvol/bdnvol/internal/verify"
)

// ErrMirror is wrapped by every error a mirror attempt reports through
// MirrorOptions.OnError.
var ErrMirror = errors.New("mirror")

// Mirror is one registry mirror speaking the OCI distribution API for
// content by digest: a pull-through cache, Spegel, Dragonfly.
type Mirror struct {
	// URL is scheme://host[:port][/path]. "/v2" is appended to the path
	// unless it already ends in "/v2" or OverridePath is set, as containerd
	// does.
	URL string
	// OverridePath uses URL's path as the API root as given.
	OverridePath bool
	// Client sends the requests; nil uses a client without retries whose
	// transport gives up on a silent mirror after MirrorOptions.Timeout.
	Client *http.Client
}

// MirrorOptions configure NewMirrorFetcher. Zero values select defaults.
type MirrorOptions struct {
	// Registry is the upstream registry host, sent to every mirror as the
	// containerd-style query parameter ns.
	Registry string
	// Repository is the repository path on the mirror (the same as upstream).
	Repository string
	// MaxBlobBytes is the largest blob asked of a mirror (it is read into
	// memory and verified whole); larger ones come from the source. <= 0
	// means 256 MiB.
	MaxBlobBytes int64
	// Timeout bounds how long a mirror may take to answer with headers;
	// <= 0 means 5s. It applies to mirrors without their own Client.
	Timeout time.Duration
	// Cooldown is how long a mirror that failed with a network error or a
	// server error is skipped; 0 means 10s, < 0 never skips.
	Cooldown time.Duration
	// OnError is called (from any goroutine) for each failed mirror
	// attempt; the fetch then tries the next mirror or the source. It may
	// be nil.
	OnError func(mirror string, desc ocispec.Descriptor, err error)
	// Limiter paces the bodies of every mirror request; nil for no bound.
	Limiter *ratelimit.Limiter
}

// MirrorStats count what a mirror fetcher did.
type MirrorStats struct {
	Hits      int64 // blobs served by a mirror and verified
	HitBytes  int64
	Misses    int64 // mirror attempts that failed (not found, error, bad bytes)
	Fallbacks int64 // blobs fetched from the source after every mirror failed or was skipped
}

// MirrorFetcher tries mirrors in order for every blob and falls back to its
// source. Bytes from a mirror are verified against the descriptor before
// they are returned, so a mirror that serves wrong bytes costs a fallback,
// never a wrong byte. It is safe for concurrent use.
type MirrorFetcher struct {
	src     content.Fetcher
	mirrors []*mirror
	opt     MirrorOptions

	mu    sync.Mutex
	stats MirrorStats
}

type mirror struct {
	base   *url.URL // scheme, host and API root path ("/v2")
	name   string   // as configured, for messages
	client *http.Client

	mu        sync.Mutex
	downUntil time.Time
}

var (
	_ content.Fetcher = (*MirrorFetcher)(nil)
	_ RangeFetcher    = (*MirrorFetcher)(nil)
)

// NewMirrorFetcher returns a fetcher that tries mirrors, in order, before
// src. It fails only on a mirror URL it cannot parse.
func NewMirrorFetcher(src content.Fetcher, mirrors []Mirror, opt MirrorOptions) (*MirrorFetcher, error) {
	if opt.MaxBlobBytes <= 0 {
		opt.MaxBlobBytes = 256 << 20
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 5 * time.Second
	}
	if opt.Cooldown == 0 {
		opt.Cooldown = 10 * time.Second
	}
	f := &MirrorFetcher{src: src, opt: opt}
	var def *http.Client
	for _, m := range mirrors {
		u, err := ParseMirrorURL(m.URL)
		if err != nil {
			return nil, err
		}
		if !m.OverridePath && !strings.HasSuffix(u.Path, "/v2") {
			u.Path = strings.TrimSuffix(u.Path, "/") + "/v2"
		}
		c := m.Client
		if c == nil {
			if def == nil {
				def = defaultMirrorClient(opt.Timeout)
			}
			c = def
		}
		if opt.Limiter != nil {
			paced := *c
			paced.Transport = ratelimit.Transport(cmp.Or[http.RoundTripper](c.Transport, http.DefaultTransport), opt.Limiter)
			c = &paced
		}
		f.mirrors = append(f.mirrors, &mirror{base: u, name: m.URL, client: c})
	}
	return f, nil
}

// ParseMirrorURL parses a mirror given as a URL or as host[:port]. A bare
// host means https, except a loopback host, which means http.
func ParseMirrorURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		scheme := "https"
		host := s
		if i := strings.IndexByte(host, '/'); i >= 0 {
			host = host[:i]
		}
		if IsLoopback(host) {
			scheme = "http"
		}
		s = scheme + "://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrMirror, s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("%w %q: want http(s)://HOST[:PORT][/PATH]", ErrMirror, s)
	}
	return u, nil
}

func defaultMirrorClient(timeout time.Duration) *http.Client {
	tr := baseTransport(timeout)
	tr.TLSHandshakeTimeout = timeout
	return &http.Client{Transport: tr}
}

// Stats returns the counters.
func (f *MirrorFetcher) Stats() MirrorStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// Fetch returns the blob desc from the first mirror that serves it
// correctly, else from the source. Bytes from a mirror are verified before
// Fetch returns; bytes from the source are returned as the source gives
// them (callers verify them).
func (f *MirrorFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if desc.Digest.Validate() == nil && desc.Size >= 0 && desc.Size <= f.opt.MaxBlobBytes {
		for _, m := range f.mirrors {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if m.skipped() {
				continue
			}
			b, err := f.fetchFrom(ctx, m, desc)
			if err == nil {
				f.mu.Lock()
				f.stats.Hits++
				f.stats.HitBytes += int64(len(b))
				f.mu.Unlock()
				return io.NopCloser(bytes.NewReader(b)), nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			f.mu.Lock()
			f.stats.Misses++
			f.mu.Unlock()
			if f.opt.OnError != nil {
				f.opt.OnError(m.name, desc, err)
			}
		}
	}
	f.mu.Lock()
	f.stats.Fallbacks++
	f.mu.Unlock()
	return f.src.Fetch(ctx, desc)
}

// FetchRange fetches part of a blob from the source (mirrors are asked for
// whole blobs only).
func (f *MirrorFetcher) FetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	rf, ok := f.src.(RangeFetcher)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return rf.FetchRange(ctx, desc, off, n)
}

func (m *mirror) skipped() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Now().Before(m.downUntil)
}

func (m *mirror) markDown(d time.Duration) {
	if d < 0 {
		return
	}
	m.mu.Lock()
	m.downUntil = time.Now().Add(d)
	m.mu.Unlock()
}

// blobURL is where m serves desc: manifests under manifests/, everything
// else under blobs/.
func (f *MirrorFetcher) blobURL(m *mirror, desc ocispec.Descriptor) string {
	u := *m.base
	kind := "blobs"
	if IsManifest(desc.MediaType) {
		kind = "manifests"
	}
	u.Path = u.Path + "/" + strings.Trim(f.opt.Repository, "/") + "/" + kind + "/" + desc.Digest.String()
	if f.opt.Registry != "" {
		u.RawQuery = url.Values{"ns": {f.opt.Registry}}.Encode()
	}
	return u.String()
}

// fetchFrom reads desc whole from m and verifies it.
func (f *MirrorFetcher) fetchFrom(ctx context.Context, m *mirror, desc ocispec.Descriptor) ([]byte, error) {
	u := f.blobURL(m, desc)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %v", ErrMirror, m.name, err)
	}
	if IsManifest(desc.MediaType) {
		req.Header.Set("Accept", desc.MediaType)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			m.markDown(f.opt.Cooldown)
		}
		return nil, fmt.Errorf("%w %s: GET %s: %v", ErrMirror, m.name, desc.Digest, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode >= 500 {
			m.markDown(f.opt.Cooldown)
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, fmt.Errorf("%w %s: GET %s: %s", ErrMirror, m.name, desc.Digest, resp.Status)
	}
	if resp.ContentLength >= 0 && resp.ContentLength != desc.Size {
		return nil, fmt.Errorf("%w %s: answered %d bytes: %w", ErrMirror, m.name, resp.ContentLength,
			verify.Digest("blob", desc, "", resp.ContentLength))
	}
	b, err := verify.ReadAll(resp.Body, "blob", desc)
	if err != nil {
		if !errors.Is(err, verify.ErrDigestMismatch) && ctx.Err() == nil {
			m.markDown(f.opt.Cooldown) // the connection failed, not the bytes
		}
		return nil, fmt.Errorf("%w %s: %s: %w", ErrMirror, m.name, desc.Digest, err)
	}
	return b, nil
}
