package peer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

const (
	testRegistry = "reg.example"
	testRepo     = "team/llm"
	testOrigin   = testRegistry + "/" + testRepo
)

// origin is the registry of a test: it serves its blobs and counts what
// it sent.
type origin struct {
	latency time.Duration // before each blob

	mu    sync.Mutex
	blobs map[digest.Digest][]byte
	gets  map[digest.Digest]int
	bytes int64
}

func (o *origin) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	time.Sleep(o.latency)
	o.mu.Lock()
	defer o.mu.Unlock()
	b, ok := o.blobs[desc.Digest]
	if !ok {
		return nil, fmt.Errorf("%s: not found", desc.Digest)
	}
	o.gets[desc.Digest]++
	o.bytes += int64(len(b))
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (o *origin) sent() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bytes
}

// version returns an origin holding n chunks of about size bytes, and
// their descriptors.
func version(n, size int) (*origin, []ocispec.Descriptor) {
	o := &origin{blobs: map[digest.Digest][]byte{}, gets: map[digest.Digest]int{}}
	r := rand.New(rand.NewPCG(1, 2))
	var descs []ocispec.Descriptor
	for range n {
		b := make([]byte, size+r.IntN(size/4))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		d := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: digest.FromBytes(b), Size: int64(len(b))}
		o.blobs[d.Digest] = b
		descs = append(descs, d)
	}
	return o, descs
}

// node is one mounter of a test fleet: its own cache directory, its peer
// server on its own loopback address, its ring.
type node struct {
	cache  *chunkcache.Cache
	ring   *Ring
	server *Server
	http   *httptest.Server
	stats  *Stats
	// corrupt makes the server flip a byte of every chunk it serves.
	corrupt bool
	// wrap, when set, stands between the server and its requests.
	wrap func(w http.ResponseWriter, r *http.Request, serve http.HandlerFunc)
	// opt are the options of the node's fetchers.
	opt Options
	// withdraw ends the mount newNode registered with the server.
	withdraw func()
}

// knows is the set of chunks of a version's manifest, as a mount that
// opened it knows them.
func knows(descs []ocispec.Descriptor) func(digest.Digest) bool {
	m := map[digest.Digest]bool{}
	for _, d := range descs {
		m[d.Digest] = true
	}
	return func(d digest.Digest) bool { return m[d] }
}

// fleet starts n nodes that know one another, each serving a mount of
// the version descs of origin o (its source registered with its server).
func fleet(t *testing.T, n int, o *origin, descs []ocispec.Descriptor) []*node {
	t.Helper()
	var nodes []*node
	var addrs []string
	for i := range n {
		nd := newNode(t, i, o, descs)
		nodes = append(nodes, nd)
		addrs = append(addrs, nd.ring.Self())
	}
	for _, nd := range nodes {
		nd.ring.Set(addrs)
	}
	return nodes
}

func newNode(t *testing.T, i int, o *origin, descs []ocispec.Descriptor) *node {
	t.Helper()
	c, err := chunkcache.Open(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:0", i+1))
	if err != nil {
		t.Fatal(err)
	}
	nd := &node{cache: c, ring: NewRing(l.Addr().String()), stats: new(Stats)}
	nd.server = &Server{Cache: c, Ring: nd.ring}
	nd.withdraw = nd.server.Serve(testOrigin, o, knows(descs))
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if nd.corrupt {
			w = &flipWriter{ResponseWriter: w}
		}
		if nd.wrap != nil {
			nd.wrap(w, r, nd.server.ServeHTTP)
			return
		}
		nd.server.ServeHTTP(w, r)
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	nd.http = srv
	return nd
}

// flipWriter inverts the first byte of a body.
type flipWriter struct {
	http.ResponseWriter
	done bool
}

func (w *flipWriter) Write(b []byte) (int, error) {
	if !w.done && len(b) > 0 {
		w.done = true
		c := append([]byte(nil), b...)
		c[0] ^= 0xff
		return w.ResponseWriter.Write(c)
	}
	return w.ResponseWriter.Write(b)
}

// readAll reads every chunk on the node as a mount does: through its
// cache's view of the origin, fetching through the peers, and checks the
// bytes.
func (nd *node) readAll(ctx context.Context, o *origin, descs []ocispec.Descriptor) error {
	view := nd.cache.For(testOrigin)
	opt := nd.opt
	opt.Scheme, opt.Stats = "http", nd.stats
	f := NewFetcher(nd.ring, testRegistry, testRepo, o, opt)
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for _, d := range descs {
		g.Go(func() error {
			ch, err := view.Load(ctx, f, d)
			if err != nil {
				return err
			}
			defer ch.Close()
			b := make([]byte, d.Size)
			if _, err := ch.ReadAt(b, 0); err != nil && err != io.EOF {
				return err
			}
			if !bytes.Equal(b, o.blobs[d.Digest]) {
				return fmt.Errorf("%s: wrong bytes", d.Digest)
			}
			return nil
		})
	}
	return g.Wait()
}

func readFleet(t *testing.T, nodes []*node, o *origin, descs []ocispec.Descriptor) {
	t.Helper()
	var g errgroup.Group
	for _, nd := range nodes {
		g.Go(func() error { return nd.readAll(context.Background(), o, descs) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

func versionBytes(descs []ocispec.Descriptor) int64 {
	var n int64
	for _, d := range descs {
		n += d.Size
	}
	return n
}

// TestFleetFetchesEachChunkOnce: four nodes reading a whole version at once
// ask the origin for each chunk once; every node reads every byte right,
// most of them from its peers.
func TestFleetFetchesEachChunkOnce(t *testing.T) {
	o, descs := version(40, 64<<10)
	nodes := fleet(t, 4, o, descs)
	readFleet(t, nodes, o, descs)
	for d, n := range o.gets {
		if n != 1 {
			t.Errorf("chunk %s: the origin was asked %d times, want once", d, n)
		}
	}
	if got, want := o.sent(), versionBytes(descs); got != want {
		t.Errorf("the origin sent %d bytes for a version of %d (%.2fx), want 1x", got, want, float64(got)/float64(want))
	}
	var served int64
	for _, nd := range nodes {
		served += nd.server.Stats().ServedBytes
	}
	if served < 2*versionBytes(descs) {
		t.Errorf("peers served %d bytes, want most of the 3 other copies of %d", served, versionBytes(descs))
	}
}

// TestFleetLateJoinerAsksNoOrigin: a node that joins after the others read
// the version gets all of it from them.
func TestFleetLateJoinerAsksNoOrigin(t *testing.T) {
	o, descs := version(30, 32<<10)
	nodes := fleet(t, 3, o, descs)
	readFleet(t, nodes, o, descs)
	before := o.sent()
	late := newNode(t, 9, o, descs)
	addrs := []string{late.ring.Self()}
	for _, nd := range nodes {
		addrs = append(addrs, nd.ring.Self())
	}
	for _, nd := range append(nodes, late) {
		nd.ring.Set(addrs)
	}
	if err := late.readAll(context.Background(), o, descs); err != nil {
		t.Fatal(err)
	}
	if got := o.sent() - before; got != 0 {
		t.Errorf("a node that joined after the others read the version asked the origin for %d bytes, want 0", got)
	}
}

// TestFleetLyingPeer: a peer that serves wrong bytes for every chunk: every
// node reads the right bytes, the liar is skipped after its first failure,
// and the origin sends at most 1.5x the version.
func TestFleetLyingPeer(t *testing.T) {
	o, descs := version(40, 64<<10)
	nodes := fleet(t, 4, o, descs)
	nodes[3].corrupt = true
	readFleet(t, nodes, o, descs)
	if got, want := o.sent(), versionBytes(descs); float64(got) > 1.5*float64(want) {
		t.Errorf("with a lying peer the origin sent %.2fx the version, want at most 1.5x", float64(got)/float64(want))
	}
	liar := nodes[3].ring.Self()
	for _, nd := range nodes[:3] {
		// 4 reads at a time: at most 4 were asked before the first failed.
		if failed := nd.stats.PeerFailures.Load(); failed < 1 || failed > 4 {
			t.Errorf("a node got %d failed answers, want the lying peer skipped after its first wrong answers (at most the 4 in flight)", failed)
		}
		for _, d := range descs[:5] {
			for _, p := range nd.ring.Owners(d.Digest) {
				if p == liar {
					t.Errorf("the lying peer is still among the owners a node asks")
				}
			}
		}
	}
}

// TestFleetOwnerGone: the owner of a share of the chunks stops half-way;
// every node still reads every chunk right, and the origin sends at most
// 1.4x the version.
func TestFleetOwnerGone(t *testing.T) {
	o, descs := version(60, 64<<10)
	nodes := fleet(t, 4, o, descs)
	half := len(descs) / 2
	readFleet(t, nodes[:3], o, descs[:half])
	nodes[3].http.Close()
	readFleet(t, nodes[:3], o, descs)
	if got, want := o.sent(), versionBytes(descs); float64(got) > 1.4*float64(want) {
		t.Errorf("with an owner gone half-way the origin sent %.2fx the version, want at most 1.4x", float64(got)/float64(want))
	}
}

// TestPeerOriginRule: a peer serves a chunk only for the origin that
// delivered it, never for another origin naming its digest, and does not
// fetch for an origin it serves no mount of; a request for more than a
// chunk's size is refused.
func TestPeerOriginRule(t *testing.T) {
	o, descs := version(4, 16<<10)
	nodes := fleet(t, 1, o, descs)
	nd := nodes[0]
	if err := nd.readAll(context.Background(), o, descs); err != nil {
		t.Fatal(err)
	}
	get := func(registry, repo string, d ocispec.Descriptor) int {
		resp, err := http.Get(fmt.Sprintf("%s/v2/%s/blobs/%s?ns=%s&size=%d", nd.http.URL, repo, d.Digest, registry, d.Size))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(testRegistry, testRepo, descs[0]); code != http.StatusOK {
		t.Fatalf("its own origin: %d, want 200", code)
	}
	for _, c := range []struct{ registry, repo string }{{"evil.example", "x"}, {testRegistry, "other/repo"}} {
		if code := get(c.registry, c.repo, descs[0]); code != http.StatusNotFound {
			t.Errorf("%s/%s naming a chunk %s delivered: %d, want 404", c.registry, c.repo, testOrigin, code)
		}
	}
	if n := len(o.gets); n != len(descs) {
		t.Errorf("the origin was asked for %d chunks, want %d", n, len(descs))
	}
	resp, err := http.Get(strings.Replace(fmt.Sprintf("%s/v2/%s/blobs/%s?ns=%s&size=%d", nd.http.URL, testRepo, descs[0].Digest, testRegistry, int64(layout.MaxChunkBytes)+1), " ", "", -1))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("a request past the largest chunk: %d, want 404", resp.StatusCode)
	}
}
