package oci

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/verify"
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

// countingFetcher serves a memory store and counts the blobs it served.
type countingFetcher struct {
	src *memory.Store

	mu sync.Mutex
	n  int
}

func (f *countingFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	f.mu.Lock()
	f.n++
	f.mu.Unlock()
	return f.src.Fetch(ctx, desc)
}

func (f *countingFetcher) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

func blobFixture(t *testing.T, n int) (*countingFetcher, []ocispec.Descriptor, map[digest.Digest][]byte) {
	t.Helper()
	store := memory.New()
	blobs := map[digest.Digest][]byte{}
	var descs []ocispec.Descriptor
	for i := range n {
		b := conformanceBytes(uint32(i+1), 1000+i)
		d := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(b), Size: int64(len(b))}
		if err := store.Push(context.Background(), d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		blobs[d.Digest] = b
		descs = append(descs, d)
	}
	return &countingFetcher{src: store}, descs, blobs
}

// fetchEach fetches every blob through f and checks its bytes.
func fetchEach(t *testing.T, f content.Fetcher, descs []ocispec.Descriptor, blobs map[digest.Digest][]byte) {
	t.Helper()
	for _, d := range descs {
		if b := fetchAll(t, f, d); !bytes.Equal(b, blobs[d.Digest]) {
			t.Fatalf("fetch %s: wrong bytes", d.Digest)
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
	fetchEach(t, mf, descs, blobs)
	if n := src.total(); n != 0 {
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
			// Right bytes only: a corrupt mirror answer is never passed on.
			fetchEach(t, mf, descs, blobs)
			if n := src.total(); n != 3 {
				t.Errorf("the source served %d blobs, want all 3", n)
			}
			if len(errs) == 0 {
				t.Error("OnError was never called")
			}
			for _, err := range errs {
				if tc.name == "corrupt" && !errors.Is(err, verify.ErrDigestMismatch) {
					t.Errorf("corrupt answer: %v, want it to wrap verify.ErrDigestMismatch", err)
				}
			}
			if st := mf.Stats(); st.Hits != 0 || st.Fallbacks != 3 {
				t.Errorf("stats %+v, want 3 fallbacks and no hits", st)
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
	fetchEach(t, mf, descs, blobs)
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

func TestMirrorLargeBlobComesFromTheSource(t *testing.T) {
	src, descs, blobs := blobFixture(t, 2)
	m := newTestMirror(t, blobs)
	// 1000 and 1001 bytes: only the first fits.
	mf, err := NewMirrorFetcher(src, []Mirror{{URL: m.srv.URL}}, MirrorOptions{Repository: "r", MaxBlobBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	fetchEach(t, mf, descs, blobs)
	if r := m.requests(); len(r) != 1 || !strings.HasSuffix(r[0], descs[0].Digest.String()+"?") {
		t.Errorf("mirror requests %q, want only the blob within MaxBlobBytes", r)
	}
	if st := mf.Stats(); st.Hits != 1 || st.Fallbacks != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestMirrorShortOrLongAnswerFallsBack(t *testing.T) {
	for name, edit := range map[string]func([]byte) []byte{
		"short": func(b []byte) []byte { return b[:len(b)-1] },
		"long":  func(b []byte) []byte { return append(b, 0) },
	} {
		t.Run(name, func(t *testing.T) {
			src, descs, blobs := blobFixture(t, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.(http.Flusher).Flush() // no Content-Length: the body decides
				w.Write(edit(blobs[descs[0].Digest]))
			}))
			t.Cleanup(srv.Close)
			var errs []error
			mf, err := NewMirrorFetcher(src, []Mirror{{URL: srv.URL}}, MirrorOptions{Repository: "r",
				OnError: func(_ string, _ ocispec.Descriptor, err error) { errs = append(errs, err) }})
			if err != nil {
				t.Fatal(err)
			}
			fetchEach(t, mf, descs, blobs)
			if src.total() != 1 || len(errs) != 1 || !errors.Is(errs[0], ErrMirror) || !errors.Is(errs[0], verify.ErrDigestMismatch) ||
				!strings.Contains(errs[0].Error(), descs[0].Digest.String()) {
				t.Errorf("source fetches %d, mirror errors %v; want one fallback and an error naming the digest", src.total(), errs)
			}
			// Wrong bytes are not a down mirror: it is asked again.
			fetchEach(t, mf, descs, blobs)
			if len(errs) != 2 {
				t.Errorf("the mirror was not asked again after a wrong answer (%d errors)", len(errs))
			}
		})
	}
}
