package metrics

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/warm"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"
)

// TestCacheAndFetchCounters loads a chunk twice through an instrumented
// registry fetcher and checks the scraped counters: one miss fetched from
// the registry, one hit served from the cache.
func TestCacheAndFetchCounters(t *testing.T) {
	ctx := context.Background()
	b := bytes.Repeat([]byte("chunk "), 1000)
	d := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(b), Size: int64(len(b))}
	store := memory.New()
	if err := store.Push(ctx, d, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	c, err := chunkcache.Open(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	m := New()
	m.Cache(c)
	m.Mounts(func() []MountSample { return []MountSample{{Digest: d.Digest.String(), Pods: 3}} }, true)
	src := m.Wrap("registry", "reg.example", store)
	for range 2 {
		ch, err := c.Load(ctx, src, d)
		if err != nil {
			t.Fatal(err)
		}
		ch.Close()
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		"bdnvol_cache_hits_total 1",
		"bdnvol_cache_misses_total 1",
		"bdnvol_cache_served_bytes_total 6000",
		`bdnvol_fetched_bytes_total{source="registry"} 6000`,
		`bdnvol_fetched_bytes_total{source="mirror"} 0`,
		`bdnvol_registry_fetches_total{host="reg.example",kind="blob"} 1`,
		`bdnvol_registry_fetched_bytes_total{host="reg.example",kind="blob"} 6000`,
		`bdnvol_fetches_in_flight{host="reg.example",source="registry"} 0`,
		`bdnvol_fetch_duration_seconds_count{host="reg.example",source="registry"} 1`,
		`bdnvol_pods{digest="` + d.Digest.String() + `"} 3`,
		"bdnvol_cache_size_bytes 6000",
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", body)
	}
}

// TestMountsWithoutDigests: by default the mount and warm metrics are
// totals with no digest or reference; with digests they are per digest,
// one digest mounted from two repositories summed into one sample.
func TestMountsWithoutDigests(t *testing.T) {
	samples := func() []MountSample {
		return []MountSample{{Digest: "sha256:aaaa", Pods: 2}, {Digest: "sha256:aaaa", Pods: 1}, {Digest: "sha256:bbbb"}}
	}
	st := func() warm.Status {
		return warm.Status{Fits: true, Entries: []warm.EntryStatus{
			{Ref: "reg.example/secret/vol:prod", Digest: "sha256:cccc", State: warm.StateWarm},
			{Ref: "reg.example/secret/vol:canary", Digest: "sha256:dddd", State: warm.StateWarm},
		}}
	}
	scrape := func(digests bool) string {
		m := New()
		m.Mounts(samples, digests)
		m.Warm(st, digests)
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		b, _ := io.ReadAll(rec.Body)
		return string(b)
	}
	def := scrape(false)
	for _, want := range []string{"bdnvol_mounts 3\n", "bdnvol_pods 3\n", `bdnvol_warm_entries{state="warm"} 2` + "\n", "bdnvol_warm_list_fits 1\n"} {
		if !strings.Contains(def, want) {
			t.Errorf("default scrape lacks %q", want)
		}
	}
	for _, leak := range []string{"sha256:", "secret/vol", "digest="} {
		if strings.Contains(def, leak) {
			t.Errorf("default scrape shows %q:\n%s", leak, def)
		}
	}
	with := scrape(true)
	for _, want := range []string{`bdnvol_mounts{digest="sha256:aaaa"} 2`, `bdnvol_pods{digest="sha256:aaaa"} 3`, `bdnvol_mounts{digest="sha256:bbbb"} 1`,
		`bdnvol_warm_state{digest="sha256:cccc",ref="reg.example/secret/vol:prod",state="warm"} 1`} {
		if !strings.Contains(with, want+"\n") {
			t.Errorf("scrape with digests lacks %q:\n%s", want, with)
		}
	}
}

// TestWrapKeepsRanges: a registry fetcher that serves byte ranges still
// does through Wrap: a range of a blob is one GET with that Range, the
// bytes are the range's, and the metrics count the range's bytes. A
// fetcher without ranges is wrapped without them.
func TestWrapKeepsRanges(t *testing.T) {
	ctx := context.Background()
	blob := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	d := ocispec.Descriptor{MediaType: "application/vnd.bdnvol.chunk.v1", Digest: digest.FromBytes(blob), Size: int64(len(blob))}
	var mu sync.Mutex
	var ranges []string
	var sent int64
	reg := registry.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			mu.Lock()
			ranges = append(ranges, r.Header.Get("Range"))
			mu.Unlock()
			cw := &countingWriter{ResponseWriter: w}
			reg.ServeHTTP(cw, r)
			mu.Lock()
			sent += cw.n
			mu.Unlock()
			return
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	ref, err := oci.ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/ranges:v1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(ctx, ref, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.Push(ctx, d, bytes.NewReader(blob)); err != nil {
		t.Fatal(err)
	}
	m := New()
	w := m.Wrap("registry", ref.Registry, tg)
	rf, ok := w.(oci.RangeFetcher)
	if !ok {
		t.Fatal("the wrapped registry fetcher does not fetch ranges")
	}
	const off, n = 300_000, 4096
	rc, err := rf.FetchRange(ctx, d, off, n)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, blob[off:off+n]) {
		t.Fatalf("range read %d bytes (%v), not the blob's %d at %d", len(got), err, n, off)
	}
	mu.Lock()
	if len(ranges) != 1 || ranges[0] != "bytes=300000-304095" || sent != n {
		t.Errorf("the registry saw GETs with Range %q and sent %d bytes; want one GET of bytes=300000-304095, %d bytes", ranges, sent, n)
	}
	mu.Unlock()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`bdnvol_registry_fetches_total{host="` + ref.Registry + `",kind="blob"} 1`,
		`bdnvol_registry_fetched_bytes_total{host="` + ref.Registry + `",kind="blob"} 4096`,
		`bdnvol_fetches_in_flight{host="` + ref.Registry + `",source="registry"} 0`,
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("scrape lacks %q:\n%s", want, body)
		}
	}
	if _, ok := m.Wrap("registry", "mem", memory.New()).(oci.RangeFetcher); ok {
		t.Error("a fetcher without ranges is wrapped as one with ranges")
	}
}

// countingWriter counts the body bytes written through it.
type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}
