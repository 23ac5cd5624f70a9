package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
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
	// a chunk comes from the source); <= 0 means 32. A request streams its
	// chunk to the reader (the cache) as it arrives, so the bytes a
	// fetcher holds in memory are a copy buffer per request, whatever the
	// chunks' size.
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
// then from src. A chunk from a peer is streamed to the reader and
// verified as it passes: a peer that fails, stalls or lies part-way ends
// the read with a *chunkcache.RefetchError naming where to fetch the chunk
// instead (the next owner, or src), so a cache load falls back and never
// keeps a wrong byte.
//
// A Fetcher serves one mount (or pull): Opened records the chunks of the
// versions opened through it (the only chunks this node, as their owner,
// fetches from src for its peers, see Known), and Close withdraws it.
type Fetcher struct {
	ring     *Ring
	registry string // the origin's registry host
	repo     string // and repository
	src      content.Fetcher
	opt      Options
	asking   atomic.Int64

	mu       sync.Mutex
	known    map[digest.Digest]bool
	withdraw func()
	closed   bool
	ready    chan struct{} // closed by the first Opened or Close
}

// openWait bounds how long Known waits for a version being opened through
// the fetcher: nodes that start one version together ask one another
// before each has read its manifests.
const openWait = 3 * time.Second

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
	return &Fetcher{ring: ring, registry: registry, repo: repo, src: src, opt: opt, known: map[digest.Digest]bool{}, ready: make(chan struct{})}
}

// Opened records the chunks of ver, a version opened through f (its
// manifests read from the origin with the credentials f's source carries):
// Known reports them from now on.
func (f *Fetcher) Opened(ver *layout.Version) {
	ds := ver.ChunkDescriptors()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range ds {
		f.known[d.Digest] = true
	}
	f.readyLocked()
}

func (f *Fetcher) readyLocked() {
	select {
	case <-f.ready:
	default:
		close(f.ready)
	}
}

// Known reports whether d is a chunk of a version opened through f: what
// this node's server fetches from f's source for a peer (a digest named in
// no manifest this node read is never fetched on a peer's word). Before
// the first version is opened it waits for it, at most openWait.
func (f *Fetcher) Known(d digest.Digest) bool {
	t := time.NewTimer(openWait)
	select {
	case <-f.ready:
	case <-t.C:
	}
	t.Stop()
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.closed && f.known[d]
}

// OnClose sets what Close calls once (the server's withdrawal of f's
// source).
func (f *Fetcher) OnClose(withdraw func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.withdraw = withdraw
}

// Close ends f's mount: Known reports nothing more, and the function
// given to OnClose is called once. Fetches still work (from src after
// peers).
func (f *Fetcher) Close() error {
	f.mu.Lock()
	w := f.withdraw
	if f.closed {
		w = nil
	}
	f.closed, f.withdraw = true, nil
	f.readyLocked()
	f.mu.Unlock()
	if w != nil {
		w()
	}
	return nil
}

// Fetch returns the blob desc: a chunk from its first owner that serves it
// (this node's own turn means the source), anything else, or after every
// owner tried refused, from the source.
func (f *Fetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	return f.fetch(ctx, desc, f.opt.Tries)
}

// fetch is Fetch asking at most tries owners.
func (f *Fetcher) fetch(ctx context.Context, desc ocispec.Descriptor, tries int) (io.ReadCloser, error) {
	if tries > 0 && desc.MediaType == layout.MediaTypeChunk && desc.Size >= 0 && desc.Size <= layout.MaxChunkBytes && desc.Digest.Validate() == nil {
		if f.asking.Add(1) <= int64(f.opt.MaxAsking) {
			if rc := f.fromPeers(ctx, desc, tries); rc != nil {
				return rc, nil // it gives its slot back when closed
			}
		}
		f.asking.Add(-1)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	f.opt.Stats.SourceHits.Add(1)
	f.opt.Stats.SourceBytes.Add(desc.Size)
	return f.src.Fetch(ctx, desc)
}

// fromPeers asks the owners of desc in turn, up to tries of them, and
// returns the answer of the first that sends the chunk, nil if none does.
// When this node owns desc itself it asks the next owner only, which
// serves it if it holds it (a node that joined after the others read it)
// and otherwise says so at once: the owner then fetches it from the
// source.
func (f *Fetcher) fromPeers(ctx context.Context, desc ocispec.Descriptor, tries int) io.ReadCloser {
	owners := f.ring.Owners(desc.Digest)
	if len(owners) > 0 && owners[0] == f.ring.Self() {
		tries = min(tries, 1)
		// A peer that asked for it before this node could fetch it has
		// fetched it itself: ask it first, then the next owner.
		if h := f.ring.Hinted(desc.Digest); h != "" {
			owners = append([]string{h}, slices.DeleteFunc(owners, func(p string) bool { return p == h })...)
			tries++
		}
	}
	asked := 0
	for _, p := range owners {
		if p == f.ring.Self() {
			continue
		}
		if asked == tries || ctx.Err() != nil {
			return nil
		}
		asked++
		rc, err := f.get(ctx, p, desc, tries-asked)
		for err != nil && unreachable(err) && f.ring.starting(p) && sleep(ctx, startRetry) {
			rc, err = f.get(ctx, p, desc, tries-asked)
		}
		if err == nil {
			return rc
		}
		f.missed(ctx, p, err)
	}
	return nil
}

// startRetry is how often a peer still starting is tried again.
const startRetry = 50 * time.Millisecond

// sleep waits d, false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// missed counts peer p's answer err other than the chunk: a refusal (not
// held, busy), or a failure, for which p is skipped a while.
func (f *Fetcher) missed(ctx context.Context, p string, err error) {
	if notHeld(err) {
		f.opt.Stats.PeerMisses.Add(1)
		return
	}
	if ctx.Err() == nil {
		f.opt.Stats.PeerFailures.Add(1)
		if unreachable(err) {
			f.ring.MarkUnreachable(p, f.opt.Cooldown)
		} else {
			f.ring.MarkDown(p, f.opt.Cooldown)
		}
	}
}

// ForPeers returns the source this node fetches from when a peer asks it
// for a chunk it owns and does not hold: the peer a hint names (Ring.Hint:
// it fetched the chunk after this node refused it), else f's source. It
// never asks the next owner, which would only refuse: the asking peer
// asks it itself.
func (f *Fetcher) ForPeers() content.Fetcher { return forPeers{f} }

type forPeers struct{ f *Fetcher }

func (p forPeers) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	f := p.f
	if desc.MediaType == layout.MediaTypeChunk && desc.Size >= 0 && desc.Size <= layout.MaxChunkBytes && desc.Digest.Validate() == nil {
		if h := f.ring.Hinted(desc.Digest); h != "" {
			if f.asking.Add(1) <= int64(f.opt.MaxAsking) {
				rc, err := f.get(ctx, h, desc, 0)
				if err == nil {
					return rc, nil // it gives its slot back when closed
				}
				f.missed(ctx, h, err)
			}
			f.asking.Add(-1)
		}
	}
	f.opt.Stats.SourceHits.Add(1)
	f.opt.Stats.SourceBytes.Add(desc.Size)
	return f.src.Fetch(ctx, desc)
}

// unreachable reports whether err is a connection to a peer refused or
// failed before any answer (a node not listening yet, or gone).
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
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

// deadline is how long a peer has to send a chunk of size bytes: Grace
// for its first byte, and the chunk at MinRate. A peer slower than that
// is given up for the next owner or the source.
func (f *Fetcher) deadline(size int64) time.Duration {
	return f.opt.Grace + time.Duration(float64(size)/float64(f.opt.MinRate)*float64(time.Second))
}

// get asks peer p for desc and returns its answer as a stream, verified as
// it is read, that must end within the deadline; left is how many more
// owners the fallback may ask.
func (f *Fetcher) get(ctx context.Context, p string, desc ocispec.Descriptor, left int) (io.ReadCloser, error) {
	rctx, cancel := context.WithTimeout(ctx, f.deadline(desc.Size))
	u := url.URL{Scheme: f.opt.Scheme, Host: p, Path: "/v2/" + f.repo + "/blobs/" + desc.Digest.String(),
		RawQuery: url.Values{"ns": {f.registry}, "size": {strconv.FormatInt(desc.Size, 10)}}.Encode()}
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, u.String(), nil)
	if err != nil {
		cancel()
		return nil, &peerError{err: err}
	}
	req.Header.Set(HeaderFrom, f.ring.Self())
	resp, err := f.opt.Client.Do(req)
	if err != nil {
		cancel()
		return nil, &peerError{err: fmt.Errorf("peer %s: %w", p, err)}
	}
	f.ring.MarkUp(p)
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		cancel()
		return nil, &peerError{status: resp.StatusCode}
	}
	if resp.ContentLength >= 0 && resp.ContentLength != desc.Size {
		resp.Body.Close()
		cancel()
		return nil, &peerError{err: fmt.Errorf("peer %s: answered %d bytes for %d", p, resp.ContentLength, desc.Size)}
	}
	return &peerBody{f: f, peer: p, desc: desc, ctx: ctx, left: left, body: resp.Body,
		vr: verify.Reader(resp.Body, "chunk", desc), cancel: cancel}, nil
}

// peerBody is a peer's chunk as it arrives, verified as it is read.
type peerBody struct {
	f      *Fetcher
	peer   string
	desc   ocispec.Descriptor
	ctx    context.Context // the reader's (the request's has the deadline)
	left   int
	body   io.ReadCloser
	vr     *verify.VerifyingReader
	cancel context.CancelFunc
	done   bool // ended: verified, or failed
	closed bool
}

// Read passes the chunk's bytes on; io.EOF only once all of them matched
// the digest. A failure (an error, the deadline, wrong or missing bytes)
// marks the peer down and is a *chunkcache.RefetchError whose Next asks
// the next owner, then the source; the bytes of the read that found it are
// held back (the reader drops the others).
func (b *peerBody) Read(p []byte) (int, error) {
	n, err := b.vr.Read(p)
	switch {
	case err == nil:
		return n, nil
	case err == io.EOF:
		if !b.done {
			b.done = true
			b.f.opt.Stats.PeerHits.Add(1)
			b.f.opt.Stats.PeerBytes.Add(b.desc.Size)
		}
		return n, io.EOF
	case b.ctx.Err() != nil:
		return 0, b.ctx.Err() // the reader gave up: not the peer's fault
	}
	if !b.done {
		b.done = true
		b.f.opt.Stats.PeerFailures.Add(1)
		b.f.ring.MarkDown(b.peer, b.f.opt.Cooldown)
	}
	return 0, &chunkcache.RefetchError{Next: fallback{b.f, b.left}, Err: fmt.Errorf("peer %s: %w", b.peer, err)}
}

// Close ends the request and gives its slot back.
func (b *peerBody) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	err := b.body.Close()
	b.cancel()
	b.f.asking.Add(-1)
	return err
}

// fallback fetches through f asking at most left more owners.
type fallback struct {
	f    *Fetcher
	left int
}

func (r fallback) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	return r.f.fetch(ctx, desc, r.left)
}
