package peer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// Options configure a Fetcher. Zero values select defaults.
type Options struct {
	// Client sends the requests to peers (mutual TLS in a cluster); nil
	// uses http.DefaultClient.
	Client *http.Client
	// Scheme is "https" (the default) or "http".
	Scheme string
	// Tries is how many owners are asked before the source; <= 0 means 2.
	Tries int
	// MinRate is the slowest a peer may send a chunk, in bytes a second,
	// before it is given up for the source; <= 0 means 20 MB/s. A peer
	// also has Grace for its first byte; <= 0 means 5 s.
	MinRate int64
	Grace   time.Duration
	// Cooldown is how long a peer that failed is skipped; <= 0 means 10 s.
	Cooldown time.Duration
	// MaxAsking bounds the requests to peers in flight at once (beyond it
	// a chunk comes from the source); <= 0 means 32.
	MaxAsking int
	// Stats, when set, receives the counters (shared by the fetchers of a
	// node).
	Stats *Stats
}

// Stats count where the chunks a node's fetchers read came from.
type Stats struct {
	PeerHits, PeerBytes     atomic.Int64 // chunks (and bytes) served by a peer, verified
	PeerMisses              atomic.Int64 // peer attempts answered "not held" (or busy)
	PeerFailures            atomic.Int64 // peer attempts that failed (error, slow, wrong bytes): the peer is skipped a while
	SourceHits, SourceBytes atomic.Int64 // chunks (and bytes) asked of the source
}

// Fetcher reads a chunk of one origin from its owners among the peers,
// then from src. Bytes from a peer are verified before they are returned.
type Fetcher struct {
	ring     *Ring
	registry string // the origin's registry host
	repo     string // and repository
	src      content.Fetcher
	opt      Options
	asking   atomic.Int64
}

// NewFetcher returns a fetcher of the chunks of registry/repo that asks
// the ring's owners before src.
func NewFetcher(ring *Ring, registry, repo string, src content.Fetcher, opt Options) *Fetcher {
	if opt.Client == nil {
		opt.Client = http.DefaultClient
	}
	if opt.Scheme == "" {
		opt.Scheme = "https"
	}
	if opt.Tries <= 0 {
		opt.Tries = 2
	}
	if opt.MinRate <= 0 {
		opt.MinRate = 20 << 20
	}
	if opt.Grace <= 0 {
		opt.Grace = 5 * time.Second
	}
	if opt.Cooldown <= 0 {
		opt.Cooldown = 10 * time.Second
	}
	if opt.MaxAsking <= 0 {
		opt.MaxAsking = 32
	}
	if opt.Stats == nil {
		opt.Stats = new(Stats)
	}
	return &Fetcher{ring: ring, registry: registry, repo: repo, src: src, opt: opt}
}

// Fetch returns the blob desc: a chunk from its first owner that serves it
// correctly (this node's own turn means the source), anything else, or
// after every owner tried failed, from the source.
func (f *Fetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if desc.MediaType == layout.MediaTypeChunk && desc.Size >= 0 && desc.Size <= layout.MaxChunkBytes && desc.Digest.Validate() == nil {
		if f.asking.Add(1) <= int64(f.opt.MaxAsking) {
			b, ok := f.fromPeers(ctx, desc)
			f.asking.Add(-1)
			if ok {
				return io.NopCloser(bytes.NewReader(b)), nil
			}
		} else {
			f.asking.Add(-1)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	f.opt.Stats.SourceHits.Add(1)
	f.opt.Stats.SourceBytes.Add(desc.Size)
	return f.src.Fetch(ctx, desc)
}

// fromPeers asks the owners of desc in turn, up to Tries of them. When
// this node owns desc itself it asks the next owner only, which serves it
// if it holds it (a node that joined after the others read it) and
// otherwise says so at once: the owner then fetches it from the source.
func (f *Fetcher) fromPeers(ctx context.Context, desc ocispec.Descriptor) ([]byte, bool) {
	owners := f.ring.Owners(desc.Digest)
	tries := f.opt.Tries
	if len(owners) > 0 && owners[0] == f.ring.Self() {
		tries = 1
	}
	asked := 0
	for _, p := range owners {
		if p == f.ring.Self() {
			continue
		}
		if asked == tries || ctx.Err() != nil {
			return nil, false
		}
		asked++
		b, err := f.get(ctx, p, desc)
		if err == nil {
			f.opt.Stats.PeerHits.Add(1)
			f.opt.Stats.PeerBytes.Add(desc.Size)
			return b, true
		}
		if notHeld(err) {
			f.opt.Stats.PeerMisses.Add(1)
			continue
		}
		f.opt.Stats.PeerFailures.Add(1)
		f.ring.MarkDown(p, f.opt.Cooldown)
	}
	return nil, false
}

// peerError is a peer's answer other than the chunk.
type peerError struct {
	status int
	err    error
}

func (e *peerError) Error() string {
	if e.err != nil {
		return e.err.Error()
	}
	return http.StatusText(e.status)
}

func (e *peerError) Unwrap() error { return e.err }

// notHeld reports whether err is a peer saying it does not hold the chunk
// or is busy (not a failure: it is not skipped for it).
func notHeld(err error) bool {
	pe, ok := err.(*peerError)
	return ok && (pe.status == http.StatusNotFound || pe.status == http.StatusServiceUnavailable)
}

// get reads desc whole from peer p within its deadline, verified.
func (f *Fetcher) get(ctx context.Context, p string, desc ocispec.Descriptor) ([]byte, error) {
	deadline := f.opt.Grace + time.Duration(float64(desc.Size)/float64(f.opt.MinRate)*float64(time.Second))
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	u := url.URL{Scheme: f.opt.Scheme, Host: p, Path: "/v2/" + f.repo + "/blobs/" + desc.Digest.String(),
		RawQuery: url.Values{"ns": {f.registry}, "size": {strconv.FormatInt(desc.Size, 10)}}.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, &peerError{err: err}
	}
	resp, err := f.opt.Client.Do(req)
	if err != nil {
		return nil, &peerError{err: fmt.Errorf("peer %s: %w", p, err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return nil, &peerError{status: resp.StatusCode}
	}
	if resp.ContentLength >= 0 && resp.ContentLength != desc.Size {
		return nil, &peerError{err: fmt.Errorf("peer %s: answered %d bytes for %d", p, resp.ContentLength, desc.Size)}
	}
	b, err := verify.ReadAll(resp.Body, "chunk", desc)
	if err != nil {
		return nil, &peerError{err: fmt.Errorf("peer %s: %w", p, err)}
	}
	return b, nil
}
