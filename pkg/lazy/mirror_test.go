package lazy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"
)

// testMirror serves blobs by digest under /v2/REPO/blobs/ and records the
// requests it saw.
type testMirror struct {
	srv     *httptest.Server
	blobs   map[digest.Digest][]byte
	corrupt bool

	mu   sync.Mutex
	reqs []string // path?query
}

func newTestMirror(t *testing.T, blobs map[digest.Digest][]byte) *testMirror {
	m := &testMirror{blobs: blobs}
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.reqs = append(m.reqs, r.URL.Path+"?"+r.URL.RawQuery)
		m.mu.Unlock()
		i := strings.LastIndex(r.URL.Path, "/")
		b, ok := m.blobs[digest.Digest(r.URL.Path[i+1:])]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if m.corrupt {
			b = append([]byte{b[0] ^ 0xff}, b[1:]...)
		}
		w.Write(b)
	}))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *testMirror) requests() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.reqs...)
}

func blobFixture(t *testing.T, n int) (*fakeFetcher, []ocispec.Descriptor, map[digest.Digest][]byte) {
	t.Helper()
	store := memory.New()
	blobs := map[digest.Digest][]byte{}
	var descs []ocispec.Descriptor
	for i := range n {
		b := randBytes(uint64(i+1), 1000+i)
		d := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(b), Size: int64(len(b))}
		if err := store.Push(context.Background(), d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		blobs[d.Digest] = b
		descs = append(descs, d)
	}
	return &fakeFetcher{src: store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}, descs, blobs
}

func fetchAll(t *testing.T, f Fetcher, descs []ocispec.Descriptor, blobs map[digest.Digest][]byte) {
	t.Helper()
	for _, d := range descs {
		rc, err := f.Fetch(context.Background(), d)
		if err != nil {
			t.Fatalf("fetch %s: %v", d.Digest, err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(b, blobs[d.Digest]) {
			t.Fatalf("fetch %s: wrong bytes (%v)", d.Digest, err)
		}
	}
}

func TestMirrorServesEverything(t *testing.T) {
	src, descs, blobs := blobFixture(t, 4)
	m := newTestMirror(t, blobs)
	mf, err := NewMirrorFetcher(src, []Mirror{{URL: m.srv.URL}}, MirrorOptions{Registry: "registry.example.com", Repository: "team/llama"})
	if err != nil {
		t.Fatal(err)
	}
	fetchAll(t, mf, descs, blobs)
	if n, _ := src.total(); n != 0 {
		t.Errorf("the source was asked for %d blobs; the mirror has them all", n)
	}
	want := "/v2/team/llama/blobs/" + descs[0].Digest.String() + "?ns=registry.example.com"
	if r := m.requests(); len(r) != 4 || r[0] != want {
		t.Errorf("mirror requests %q, want 4 starting with %q", r, want)
	}
	if st := mf.Stats(); st.Hits != 4 || st.Fallbacks != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestMirrorFallsBack(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(m *testMirror, blobs map[digest.Digest][]byte) string
	}{
		{"corrupt", func(m *testMirror, _ map[digest.Digest][]byte) string { m.corrupt = true; return m.srv.URL }},
		{"missing", func(m *testMirror, blobs map[digest.Digest][]byte) string { clear(blobs); return m.srv.URL }},
		{"down", func(m *testMirror, _ map[digest.Digest][]byte) string { u := m.srv.URL; m.srv.Close(); return u }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, descs, blobs := blobFixture(t, 3)
			mblobs := map[digest.Digest][]byte{}
			for k, v := range blobs {
				mblobs[k] = v
			}
			m := newTestMirror(t, mblobs)
			u := tc.setup(m, mblobs)
			var errs []error
			var mu sync.Mutex
			mf, err := NewMirrorFetcher(src, []Mirror{{URL: u}}, MirrorOptions{Repository: "r",
				OnError: func(_ string, _ ocispec.Descriptor, err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }})
			if err != nil {
				t.Fatal(err)
			}
			// Through the cache, as mounts use it: right bytes, and only
			// verified ones are cached.
			c, err := OpenCache(t.TempDir(), 0)
			if err != nil {
				t.Fatal(err)
			}
			fetchAll(t, c.Fetcher(mf), descs, blobs)
			if n, _ := src.total(); n != 3 {
				t.Errorf("the source served %d blobs, want all 3", n)
			}
			if len(errs) == 0 {
				t.Error("OnError was never called")
			}
			if st := c.Stats(); st.Corrupt != 0 {
				t.Errorf("the cache saw %d corrupt blobs; the mirror fetcher must not pass them on", st.Corrupt)
			}
		})
	}
}

func TestMirrorDownIsSkippedForCooldown(t *testing.T) {
	src, descs, blobs := blobFixture(t, 3)
	m := newTestMirror(t, blobs)
	u := m.srv.URL
	m.srv.Close()
	var calls int
	mf, err := NewMirrorFetcher(src, []Mirror{{URL: u}}, MirrorOptions{Repository: "r",
		OnError: func(string, ocispec.Descriptor, error) { calls++ }})
	if err != nil {
		t.Fatal(err)
	}
	fetchAll(t, mf, descs, blobs)
	if calls != 1 {
		t.Errorf("a down mirror was tried %d times, want once, then skipped", calls)
	}
}

func TestMirrorURL(t *testing.T) {
	for in, want := range map[string]string{
		"mirror.example.com":         "https://mirror.example.com/v2/a/b/blobs/",
		"127.0.0.1:5000":             "http://127.0.0.1:5000/v2/a/b/blobs/",
		"https://m.example.com/v2":   "https://m.example.com/v2/a/b/blobs/",
		"https://m.example.com/pull": "https://m.example.com/pull/v2/a/b/blobs/",
	} {
		mf, err := NewMirrorFetcher(nil, []Mirror{{URL: in}}, MirrorOptions{Repository: "a/b"})
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		d := ocispec.Descriptor{Digest: digest.FromString("x")}
		if got := mf.blobURL(mf.mirrors[0], d); got != want+d.Digest.String() {
			t.Errorf("%s: %s, want %s", in, got, want+d.Digest.String())
		}
	}
	for _, bad := range []string{"ftp://x", "https://", "https://u:p@x", "https://x?y=1"} {
		if _, err := NewMirrorFetcher(nil, []Mirror{{URL: bad}}, MirrorOptions{}); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

func TestParseHostsConfig(t *testing.T) {
	const file = `
# containerd registry host namespace configuration
server = "https://registry.example.com"   # upstream

[host."https://spegel.local:5000"]
  capabilities = ["pull", "resolve"]
  skip_verify = true

[host."http://push-only.local"]
  capabilities = [
    "push", # not for reads
  ]

[host."https://dragonfly.local/base"]
  override_path = true
  ca = ["/etc/a.pem", '/etc/b.pem']
  [host."https://dragonfly.local/base".header]
    x-custom = ["1"]

[[plugins]]
  server = "ignored"
`
	c, err := ParseHostsConfig([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	want := &HostsConfig{Server: "https://registry.example.com", Hosts: []HostEntry{
		{URL: "https://spegel.local:5000", Capabilities: []string{"pull", "resolve"}, SkipVerify: true},
		{URL: "http://push-only.local", Capabilities: []string{"push"}},
		{URL: "https://dragonfly.local/base", OverridePath: true, CA: []string{"/etc/a.pem", "/etc/b.pem"}},
	}}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", c, want)
	}
	var urls []string
	for _, h := range c.Mirrors("registry.example.com") {
		urls = append(urls, h.URL)
	}
	if want := []string{"https://spegel.local:5000", "https://dragonfly.local/base"}; !reflect.DeepEqual(urls, want) {
		t.Errorf("mirrors %q, want %q (pull hosts only, server is the registry itself)", urls, want)
	}
	urls = urls[:0]
	for _, h := range c.Mirrors("other.example.com") {
		urls = append(urls, h.URL)
	}
	if len(urls) != 3 || urls[2] != "https://registry.example.com" {
		t.Errorf("mirrors for another registry %q: the server goes last", urls)
	}

	for _, bad := range []string{`server = `, `[host."x"`, `server = "unterminated`, `capabilities`, `[host."h"]` + "\n" + `skip_verify = "yes"`} {
		if _, err := ParseHostsConfig([]byte(bad)); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func TestLoadHostsConfig(t *testing.T) {
	dir := t.TempDir()
	if c, err := LoadHostsConfig(dir, "reg.example.com"); c != nil || err != nil {
		t.Fatalf("no file: %v, %v", c, err)
	}
	write := func(name, s string) {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "hosts.toml"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("_default", `[host."https://default.mirror"]`)
	write("reg.example.com:5000", `[host."https://reg.mirror"]`)
	for reg, want := range map[string]string{"reg.example.com:5000": "https://reg.mirror", "other": "https://default.mirror"} {
		c, err := LoadHostsConfig(dir, reg)
		if err != nil || c == nil || len(c.Hosts) != 1 || c.Hosts[0].URL != want {
			t.Errorf("%s: %+v, %v; want %s", reg, c, err, want)
		}
	}
}
