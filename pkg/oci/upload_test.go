package oci

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"oras.land/oras-go/v2/content"
)

// faulty wraps a real registry: it answers 413 to bodies over limit, 503 to
// every failEvery-th request, and can cut one PATCH body short.
type faulty struct {
	next      http.Handler
	limit     int64
	failEvery int64
	n         atomic.Int64
	patches   atomic.Int64
	puts      atomic.Int64
}

func (f *faulty) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if k := f.n.Add(1); f.failEvery > 0 && k%f.failEvery == 0 {
		io.Copy(io.Discard, r.Body)
		http.Error(w, "try later", http.StatusServiceUnavailable)
		return
	}
	if f.limit > 0 && r.ContentLength > f.limit {
		io.Copy(io.Discard, r.Body)
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
		return
	}
	switch r.Method {
	case http.MethodPatch:
		f.patches.Add(1)
	case http.MethodPut:
		f.puts.Add(1)
	}
	f.next.ServeHTTP(w, r)
}

func pushAndFetch(t *testing.T, f *faulty, opt Options, data []byte) {
	t.Helper()
	srv := httptest.NewServer(f)
	defer srv.Close()
	ref, err := ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/test:v1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tg, err := Open(ctx, ref, opt)
	if err != nil {
		t.Fatal(err)
	}
	desc := content.NewDescriptorFromBytes("application/vnd.bdnvol.chunk.v1", data)
	if err := tg.Push(ctx, desc, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	got, err := content.FetchAll(ctx, tg, desc)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetched %d bytes (%v), want the %d pushed", len(got), err, len(data))
	}
}

func TestUploadFallsBackToPartsOn413(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 600<<10/16) // 600 KiB
	f := &faulty{next: quietRegistry(), limit: 300 << 10}
	pushAndFetch(t, f, Options{}, data)
	// 4 MiB parts are too large too: halved down to 256 KiB, three parts.
	if f.patches.Load() < 3 {
		t.Fatalf("%d PATCH requests, want the upload split into parts", f.patches.Load())
	}
}

func TestUploadInParts(t *testing.T) {
	data := bytes.Repeat([]byte{7}, 1<<20+5)
	f := &faulty{next: quietRegistry()}
	pushAndFetch(t, f, Options{PartSize: 256 << 10}, data)
	if f.patches.Load() != 5 {
		t.Fatalf("%d PATCH requests, want 5 parts of 256 KiB", f.patches.Load())
	}
}

func TestUploadRetries503(t *testing.T) {
	data := bytes.Repeat([]byte{9}, 700<<10)
	f := &faulty{next: quietRegistry(), failEvery: 3}
	pushAndFetch(t, f, Options{PartSize: 128 << 10, Retry: RetryPolicy{Base: 1}}, data)
}

func TestRetryAfter(t *testing.T) {
	for v, want := range map[string]bool{"2": true, "": false, "junk": false} {
		if got := retryAfter(v) > 0; got != want {
			t.Errorf("Retry-After %q: %v", v, got)
		}
	}
}

// cutPatch drops the connection half-way through the body of one PATCH.
type cutPatch struct {
	next  http.Handler
	which int64 // the PATCH to cut, counting from 1
	n     atomic.Int64
	cut   atomic.Bool
}

func (c *cutPatch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPatch && c.n.Add(1) == c.which {
		io.CopyN(io.Discard, r.Body, r.ContentLength/2)
		c.cut.Store(true)
		panic(http.ErrAbortHandler)
	}
	c.next.ServeHTTP(w, r)
}

func TestUploadSurvivesACutPart(t *testing.T) {
	data := bytes.Repeat([]byte("part"), 300<<10) // 1.2 MiB
	c := &cutPatch{next: quietRegistry(), which: 2}
	srv := httptest.NewServer(c)
	defer srv.Close()
	ref, _ := ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/cut:v1")
	ctx := context.Background()
	tg, err := Open(ctx, ref, Options{PartSize: 256 << 10, Retry: RetryPolicy{Base: 1}})
	if err != nil {
		t.Fatal(err)
	}
	desc := content.NewDescriptorFromBytes("application/vnd.bdnvol.chunk.v1", data)
	if err := tg.Push(ctx, desc, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if !c.cut.Load() {
		t.Fatal("no part was cut")
	}
	got, err := content.FetchAll(ctx, tg, desc)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetched %d bytes (%v)", len(got), err)
	}
}

// quietRegistry is go-containerregistry's in-memory registry, not logging.
func quietRegistry() http.Handler {
	return ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)))
}

// lostSession answers the first `lose` upload PUTs with 404
// BLOB_UPLOAD_UNKNOWN after reading their bodies, as a registry that gave up
// on the session does; it counts the sessions started.
type lostSession struct {
	next     http.Handler
	lose     int64
	puts     atomic.Int64
	sessions atomic.Int64
}

func (l *lostSession) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/blobs/uploads/") {
		l.sessions.Add(1)
	}
	if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/blobs/uploads/") && l.puts.Add(1) <= l.lose {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"errors":[{"code":"BLOB_UPLOAD_UNKNOWN","message":"upload gone"}]}`)
		return
	}
	l.next.ServeHTTP(w, r)
}

func openTest(t *testing.T, h http.Handler, opt Options) Target {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	ref, err := ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/test:v1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := Open(context.Background(), ref, opt)
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

// A session the registry gave up on is started over, the bytes read again
// from the source; the transport's retries cannot do that, as the registry
// refuses the session for good.
func TestUploadStartsALostSessionOver(t *testing.T) {
	data := bytes.Repeat([]byte("lost"), 1000)
	l := &lostSession{next: quietRegistry(), lose: 2}
	tg := openTest(t, l, Options{})
	ctx := context.Background()
	desc := content.NewDescriptorFromBytes("application/vnd.bdnvol.chunk.v1", data)
	if err := tg.Push(ctx, desc, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if n := l.sessions.Load(); n != 3 {
		t.Errorf("%d upload sessions, want 3 (two lost, one kept)", n)
	}
	if got, err := content.FetchAll(ctx, tg, desc); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetched %d bytes (%v)", len(got), err)
	}

	// Every session lost: the error names the blob, after a bounded number
	// of sessions.
	l = &lostSession{next: quietRegistry(), lose: 1 << 30}
	tg = openTest(t, l, Options{})
	err := tg.Push(ctx, desc, bytes.NewReader(data))
	if err == nil || !strings.Contains(err.Error(), desc.Digest.String()) {
		t.Fatalf("push to a registry that loses every session: %v", err)
	}
	if n := l.sessions.Load(); n != 3 {
		t.Errorf("%d sessions, want 3", n)
	}
}

// failingAt is a source whose reads fail after the first n bytes.
type failingAt struct {
	data []byte
	n    int64
}

var errSourceGone = errors.New("source gone")

func (f failingAt) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > f.n {
		return 0, errSourceGone
	}
	return copy(p, f.data[off:]), nil
}

// A source that fails to read is not retried in a new session: the error
// is the source's.
func TestUploadSourceFailureIsNotRetried(t *testing.T) {
	data := bytes.Repeat([]byte("src!"), 1000)
	l := &lostSession{next: quietRegistry()}
	tg := openTest(t, l, Options{Retry: RetryPolicy{Base: 1}})
	desc := content.NewDescriptorFromBytes("application/vnd.bdnvol.chunk.v1", data)
	err := tg.Push(context.Background(), desc, io.NewSectionReader(failingAt{data, 100}, 0, int64(len(data))))
	if !errors.Is(err, errSourceGone) {
		t.Fatalf("push from a failing source: %v; want its error", err)
	}
	if n := l.sessions.Load(); n != 1 {
		t.Errorf("%d sessions for a failing source, want 1", n)
	}
}

// fileContent is blob content in a file that offers it as such
// (FileOpener), counting the bytes read through ReadAt.
type fileContent struct {
	path    string
	data    []byte
	readAt  atomic.Int64
	opens   atomic.Int64
	openErr error
}

func (c *fileContent) ReadAt(p []byte, off int64) (int, error) {
	n := copy(p, c.data[min(off, int64(len(c.data))):])
	c.readAt.Add(int64(n))
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (c *fileContent) Read([]byte) (int, error) { return 0, errors.New("Read: want ReadAt") }

func (c *fileContent) OpenRange(off, n int64) (*os.File, error) {
	c.opens.Add(1)
	if c.openErr != nil {
		return nil, c.openErr
	}
	f, err := os.Open(c.path)
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Content that opens as a file is uploaded from the file (whole, and in
// parts at their offsets), never read through ReadAt.
func TestUploadFromFile(t *testing.T) {
	data := make([]byte, 3<<20+123)
	for i := range data {
		data[i] = byte(i * 7 / 5)
	}
	path := filepath.Join(t.TempDir(), "blob")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, part := range []int64{0, 1 << 20} {
		c := &fileContent{path: path, data: data}
		tg := openTest(t, quietRegistry(), Options{PartSize: part})
		ctx := context.Background()
		desc := content.NewDescriptorFromBytes("application/vnd.bdnvol.chunk.v1", data)
		if err := tg.Push(ctx, desc, c); err != nil {
			t.Fatal(err)
		}
		if got, err := content.FetchAll(ctx, tg, desc); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("part size %d: fetched %d bytes (%v), want the %d pushed", part, len(got), err, len(data))
		}
		if n := c.readAt.Load(); n != 0 {
			t.Errorf("part size %d: %d bytes read through ReadAt, want none (the file sent)", part, n)
		}
		if c.opens.Load() == 0 {
			t.Errorf("part size %d: the file was never opened", part)
		}
	}

	// A file that cannot be opened fails the upload as the source's
	// failure, in one session.
	c := &fileContent{path: path, data: data, openErr: errSourceGone}
	l := &lostSession{next: quietRegistry()}
	tg := openTest(t, l, Options{Retry: RetryPolicy{Base: 1}})
	desc := content.NewDescriptorFromBytes("application/vnd.bdnvol.chunk.v1", data)
	if err := tg.Push(context.Background(), desc, c); !errors.Is(err, errSourceGone) {
		t.Fatalf("push from a file that cannot be opened: %v; want its error", err)
	}
	if n := l.sessions.Load(); n != 1 {
		t.Errorf("%d sessions, want 1", n)
	}
}
