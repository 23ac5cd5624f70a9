package peer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// halfWriter passes the first half of a body, then kills the connection
// and calls cut (a node that dies while it sends a chunk).
type halfWriter struct {
	http.ResponseWriter
	left int64
	cut  func()
}

func (w *halfWriter) Write(b []byte) (int, error) {
	if int64(len(b)) > w.left {
		w.ResponseWriter.Write(b[:w.left])
		w.ResponseWriter.(http.Flusher).Flush()
		w.cut()
		panic(http.ErrAbortHandler)
	}
	w.left -= int64(len(b))
	return w.ResponseWriter.Write(b)
}

// TestFleetOwnerKilledMidChunk: the owner of a quarter of the chunks dies
// half-way through the version, in the middle of sending a chunk, and
// stays dead; every reader still reads every byte right (the chunk cut
// off is fetched again from the next owner or the registry), and the
// origin sends at most 1.4x the version.
func TestFleetOwnerKilledMidChunk(t *testing.T) {
	o, descs := version(60, 64<<10)
	nodes := fleet(t, 4, o, descs)
	victim := nodes[3]
	var asked atomic.Int64
	var dead atomic.Bool
	var once sync.Once
	victim.wrap = func(w http.ResponseWriter, r *http.Request, serve http.HandlerFunc) {
		if dead.Load() {
			panic(http.ErrAbortHandler)
		}
		// Its share is about 3 askers x 15 chunks: from its 20th request
		// on, it dies in the middle of the first chunk it sends.
		if asked.Add(1) < 20 {
			serve(w, r)
			return
		}
		size, _ := strconv.ParseInt(r.URL.Query().Get("size"), 10, 64)
		serve(&halfWriter{ResponseWriter: w, left: size / 2, cut: func() {
			once.Do(func() {
				dead.Store(true)
				go victim.http.Close()
			})
		}}, r)
	}
	readFleet(t, nodes[:3], o, descs)
	if !dead.Load() {
		t.Fatal("the owner sent no chunk from its 20th request on: nothing was killed")
	}
	if got, want := o.sent(), versionBytes(descs); float64(got) > 1.4*float64(want) {
		t.Errorf("with an owner killed half-way the origin sent %.2fx the version, want at most 1.4x", float64(got)/float64(want))
	}
	var failed int64
	for _, nd := range nodes[:3] {
		failed += nd.stats.PeerFailures.Load()
	}
	if failed == 0 {
		t.Error("no reader saw the owner fail")
	}
}

// TestFetcherSlowPeer: a peer that sends a chunk's headers and a few bytes
// and then nothing is given up at the deadline (Grace, plus the chunk at
// MinRate): the reader gets the chunk from the registry, the peer is
// skipped from then on, and no read waits on it again.
func TestFetcherSlowPeer(t *testing.T) {
	o, descs := version(8, 32<<10)
	nodes := fleet(t, 2, o, descs)
	reader, slow := nodes[0], nodes[1]
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var asked atomic.Int64
	slow.wrap = func(w http.ResponseWriter, r *http.Request, serve http.HandlerFunc) {
		asked.Add(1)
		w.Header().Set("Content-Length", r.URL.Query().Get("size"))
		w.WriteHeader(http.StatusOK)
		w.Write([]byte("a few"))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}
	reader.opt = Options{Grace: 200 * time.Millisecond, MinRate: 1 << 30}
	// A guard, not a measure: without a deadline the read waits for ever.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := reader.readAll(ctx, o, descs); err != nil {
		t.Fatalf("a slow peer stalled the reader: %v", err)
	}
	if f := reader.stats.PeerFailures.Load(); f < 1 || f > 4 {
		t.Errorf("%d peer failures, want the slow peer given up once per read in flight (1 to 4)", f)
	}
	if n := asked.Load(); n > 4 {
		t.Errorf("the slow peer was asked %d times, want it skipped after it missed its deadline (at most the 4 reads in flight)", n)
	}
	if got, want := o.sent(), versionBytes(descs); got != want {
		t.Errorf("the origin sent %d bytes, want the version (%d) once", got, want)
	}
}

// TestPeerOwnerRefusesUnknownDigest: a node asking an owner for a digest
// that no manifest the owner read lists (a blob of the repository that is
// in none of the versions mounted here) gets 404, and the owner does not
// fetch it from the registry on the asker's word; a chunk of the mounted
// version it fetches and serves.
func TestPeerOwnerRefusesUnknownDigest(t *testing.T) {
	o, descs := version(3, 16<<10)
	secret := bytes.Repeat([]byte("another version's weights "), 1000)
	sd := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: digest.FromBytes(secret), Size: int64(len(secret))}
	o.blobs[sd.Digest] = secret
	nodes := fleet(t, 1, o, descs) // one node: it owns every digest
	nd := nodes[0]
	get := func(d ocispec.Descriptor) int {
		resp, err := http.Get(fmt.Sprintf("%s/v2/%s/blobs/%s?ns=%s&size=%d", nd.http.URL, testRepo, d.Digest, testRegistry, d.Size))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(sd); code != http.StatusNotFound {
		t.Errorf("a digest in no manifest read here: %d, want 404", code)
	}
	if n := o.gets[sd.Digest]; n != 0 {
		t.Errorf("the owner fetched a digest in no manifest it read from the registry %d times, want 0", n)
	}
	if code := get(descs[0]); code != http.StatusOK {
		t.Errorf("a chunk of the mounted version, not held yet: %d, want 200 (fetched as its owner)", code)
	}
}

// blockingSource is an origin whose fetches wait for release.
type blockingSource struct {
	*origin
	inFlight atomic.Int64
	release  chan struct{}
}

func (b *blockingSource) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	b.inFlight.Add(1)
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.origin.Fetch(ctx, desc)
}

// TestServerBusy: a server serving MaxServing requests answers the next
// with 503 at once (the asker goes to its next choice), and serves again
// once they end.
func TestServerBusy(t *testing.T) {
	o, descs := version(4, 16<<10)
	src := &blockingSource{origin: o, release: make(chan struct{})}
	nodes := fleet(t, 1, o, descs)
	nd := nodes[0]
	nd.server.MaxServing = 2
	nd.server.Serve(testOrigin, src, knows(descs)) // the latest mount: its source fetches
	client := &http.Client{Timeout: 20 * time.Second}
	get := func(d ocispec.Descriptor) (int, error) {
		resp, err := client.Get(fmt.Sprintf("%s/v2/%s/blobs/%s?ns=%s&size=%d", nd.http.URL, testRepo, d.Digest, testRegistry, d.Size))
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	var g errgroup.Group
	for _, d := range descs[:2] {
		g.Go(func() error {
			code, err := get(d)
			if err == nil && code != http.StatusOK {
				err = fmt.Errorf("a request within the bound: %d, want 200", code)
			}
			return err
		})
	}
	for src.inFlight.Load() < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	code, err := get(descs[2])
	close(src.release)
	if err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("a request past the bound: %d, %v; want 503 at once", code, err)
	}
	if err := g.Wait(); err != nil {
		t.Error(err)
	}
	if code, err := get(descs[3]); err != nil || code != http.StatusOK {
		t.Errorf("after the busy requests ended: %d, %v; want 200", code, err)
	}
}

// TestFetcherStreamsWithinBound: a peer's chunk reaches the reader as it
// arrives (its first half is read while the peer still holds the rest),
// so a fetcher holds a copy buffer per request, not whole chunks; and at
// most MaxAsking requests to peers are open at once: the fetches beyond
// go to the registry.
func TestFetcherStreamsWithinBound(t *testing.T) {
	o, descs := version(6, 256<<10)
	nodes := fleet(t, 2, o, descs)
	reader, peer := nodes[0], nodes[1]
	// The peer holds every chunk already.
	if err := peer.readAll(context.Background(), o, descs); err != nil {
		t.Fatal(err)
	}
	before := o.sent()
	release := make(chan struct{})
	var open, most atomic.Int64
	var mu sync.Mutex
	peer.wrap = func(w http.ResponseWriter, r *http.Request, serve http.HandlerFunc) {
		n := open.Add(1)
		defer open.Add(-1)
		mu.Lock()
		most.Store(max(most.Load(), n))
		mu.Unlock()
		size, _ := strconv.ParseInt(r.URL.Query().Get("size"), 10, 64)
		serve(&holdWriter{ResponseWriter: w, left: size / 2, release: release, gone: r.Context().Done()}, r)
	}
	// Every chunk is asked of the peer, which holds them all.
	ring := NewRing(reader.ring.Self())
	ring.Set([]string{peer.ring.Self()})
	f := NewFetcher(ring, testRegistry, testRepo, o, Options{Scheme: "http", MaxAsking: 2, Grace: 10 * time.Second})
	// A guard, not a measure: a fetcher that read whole chunks would wait
	// for ever here.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var bodies []io.ReadCloser
	for _, d := range descs {
		rc, err := f.Fetch(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, rc)
	}
	for i, rc := range bodies[:2] {
		half := make([]byte, descs[i].Size/2)
		if _, err := io.ReadFull(rc, half); err != nil {
			t.Fatalf("the first half of a chunk the peer is still sending: %v", err)
		}
	}
	close(release)
	for i, rc := range bodies {
		b, err := io.ReadAll(rc)
		if i < 2 {
			b = append(make([]byte, descs[i].Size/2), b...)
			copy(b, o.blobs[descs[i].Digest][:descs[i].Size/2])
		}
		rc.Close()
		if err != nil || !bytes.Equal(b, o.blobs[descs[i].Digest]) {
			t.Errorf("chunk %d: %v, right bytes %v", i, err, bytes.Equal(b, o.blobs[descs[i].Digest]))
		}
	}
	if n := most.Load(); n > 2 {
		t.Errorf("%d requests to the peer were open at once, want at most MaxAsking (2)", n)
	}
	if got, want := o.sent()-before, versionBytes(descs[2:]); got != want {
		t.Errorf("the registry sent %d bytes, want the 4 chunks past the bound (%d)", got, want)
	}
}

// holdWriter passes the first left bytes of a body at once, the rest once
// release is closed (or the asker is gone).
type holdWriter struct {
	http.ResponseWriter
	left    int64
	release chan struct{}
	gone    <-chan struct{}
}

func (w *holdWriter) wait() {
	select {
	case <-w.release:
	case <-w.gone:
	}
}

func (w *holdWriter) Write(b []byte) (int, error) {
	if w.left > 0 && int64(len(b)) > w.left {
		n, err := w.ResponseWriter.Write(b[:w.left])
		w.left = 0
		w.ResponseWriter.(http.Flusher).Flush()
		if err != nil {
			return n, err
		}
		w.wait()
		m, err := w.ResponseWriter.Write(b[n:])
		return n + m, err
	}
	if w.left > 0 {
		w.left -= int64(len(b))
	} else {
		w.wait()
	}
	return w.ResponseWriter.Write(b)
}

// TestServeWithdraw: a mount's source fetches for the peers only while the
// mount lasts: withdrawn (the Fetcher closed, as a mount's end closes
// it), the owner refuses a chunk it does not hold; a second mount of the
// same origin keeps fetching when the first ends.
func TestServeWithdraw(t *testing.T) {
	o, descs := version(4, 16<<10)
	nodes := fleet(t, 1, o, nil) // the fleet's own registration knows no chunk
	nd := nodes[0]
	get := func(d ocispec.Descriptor) int {
		resp, err := http.Get(fmt.Sprintf("%s/v2/%s/blobs/%s?ns=%s&size=%d", nd.http.URL, testRepo, d.Digest, testRegistry, d.Size))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	mount := func() *Fetcher {
		f := NewFetcher(nd.ring, testRegistry, testRepo, o, Options{Scheme: "http"})
		f.OnClose(nd.server.Serve(testOrigin, o, f.Known))
		f.known = map[digest.Digest]bool{}
		for _, d := range descs {
			f.known[d.Digest] = true
		}
		return f
	}
	a, b := mount(), mount()
	if code := get(descs[0]); code != http.StatusOK {
		t.Fatalf("two mounts: %d, want 200", code)
	}
	a.Close()
	if code := get(descs[1]); code != http.StatusOK {
		t.Errorf("one mount of the two ended: %d, want 200 (the other still fetches)", code)
	}
	b.Close()
	b.Close()
	if code := get(descs[2]); code != http.StatusNotFound {
		t.Errorf("both mounts ended: %d, want 404 (no source left)", code)
	}
	if code := get(descs[0]); code != http.StatusOK {
		t.Errorf("a chunk held: %d, want 200 (served from the cache whatever the mounts)", code)
	}
	if n := o.gets[descs[2].Digest]; n != 0 {
		t.Errorf("the registry was asked for a chunk after the mounts ended: %d, want 0", n)
	}
}

// TestRingUnreachableBackoff: a peer that refused a connection (a node
// still starting) is skipped briefly, then for twice as long at each
// refusal in a row, never past the cooldown; an answer resets it. A peer
// that served wrong bytes is skipped for the whole cooldown at once.
func TestRingUnreachableBackoff(t *testing.T) {
	r := NewRing("10.0.0.1:1")
	r.Set([]string{"10.0.0.2:1", "10.0.0.3:1"})
	skip := func(addr string) time.Duration {
		r.mu.Lock()
		defer r.mu.Unlock()
		return time.Until(r.downUntil[addr])
	}
	const cooldown = 10 * time.Second
	var last time.Duration
	for i := range 8 {
		r.MarkUnreachable("10.0.0.2:1", cooldown)
		d := skip("10.0.0.2:1")
		want := min(firstUnreachable<<i, cooldown)
		if d > want || d < want-time.Second/2 {
			t.Errorf("refusal %d: skipped for %v, want about %v", i+1, d, want)
		}
		last = d
	}
	if last > cooldown {
		t.Errorf("skipped for %v, past the cooldown %v", last, cooldown)
	}
	r.MarkUp("10.0.0.2:1")
	r.MarkUnreachable("10.0.0.2:1", cooldown)
	if d := skip("10.0.0.2:1"); d > firstUnreachable {
		t.Errorf("a refusal after an answer: skipped for %v, want %v again", d, firstUnreachable)
	}
	r.MarkDown("10.0.0.3:1", cooldown)
	if d := skip("10.0.0.3:1"); d < cooldown-time.Second {
		t.Errorf("a peer that failed otherwise: skipped for %v, want the cooldown %v", d, cooldown)
	}
}
