package source

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/semaphore"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/push"
)

// small blocks and few requests, so tests cover readahead and ranges.
var testOpts = Options{BlockSize: 64 << 10, Concurrency: 4, Readahead: 3}

func hubFiles() (map[string][]byte, map[string]bool) {
	files := map[string][]byte{
		"config.json":         []byte(`{"hidden_size": 8}`),
		"README.md":           []byte("# model\n"),
		"weights.bin":         randBytes(1, 3<<20+12345),
		"sub/dir/shard.bin":   randBytes(2, 1<<20+7),
		"sub/tokenizer.json":  []byte(`{"vocab": {}}`),
		"sub/dir/empty.txt":   {},
		"sub/dir/small-lfs.z": randBytes(3, 1000),
	}
	lfs := map[string]bool{"weights.bin": true, "sub/dir/shard.bin": true, "sub/dir/small-lfs.z": true}
	return files, lfs
}

// pushSource pushes src into a memory store and returns the result.
func pushSource(t *testing.T, src Source) (*push.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return push.Push(ctx, memory.New(), src, push.Options{Params: layout.Params{Min: 256 << 10, Avg: 512 << 10, Max: 1 << 20}})
}

// checkIndex checks that the pushed index holds exactly want, byte for
// byte (by SHA-256), with the directories that hold them.
func checkIndex(t *testing.T, x *layout.Index, want map[string][]byte) {
	t.Helper()
	got := map[string]digest.Digest{}
	for fi := range x.Len() {
		f := x.File(fi)
		if f.Type == layout.TypeFile {
			got[f.Path] = f.Digest
			if f.Mode != 0o644 {
				t.Errorf("%s: mode %o", f.Path, f.Mode)
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("index has %d files, want %d: %v", len(got), len(want), got)
	}
	for p, b := range want {
		if got[p] != digest.FromBytes(b) {
			t.Errorf("%s: digest %s, want %s", p, got[p], digest.FromBytes(b))
		}
	}
}

func TestHubSyncsPinnedCommitVerifiedAndTokenOnlyToHub(t *testing.T) {
	files, lfs := hubFiles()
	hub := newFakeHub(t, files, lfs)
	t.Setenv("HF_ENDPOINT", hub.hub.URL)
	t.Setenv("HF_TOKEN", "hf_secret_token")
	src, err := Open(context.Background(), "hf://org/repo", testOpts)
	if err != nil {
		t.Fatal(err)
	}
	res, err := pushSource(t, src)
	if err != nil {
		t.Fatal(err)
	}
	checkIndex(t, res.Index, files)
	if err := Verify(context.Background(), src, res.Index); err != nil {
		t.Fatal(err)
	}
	if src.Revision() != hub.commit {
		t.Errorf("revision %q, want %q", src.Revision(), hub.commit)
	}
	dirs := map[string]bool{}
	for fi := range res.Index.Len() {
		f := res.Index.File(fi)
		if f.Type == layout.TypeDir {
			dirs[f.Path] = true
		}
	}
	if !dirs["sub"] || !dirs["sub/dir"] || len(dirs) != 2 {
		t.Errorf("directories %v, want sub and sub/dir", dirs)
	}
	hub.mu.Lock()
	defer hub.mu.Unlock()
	for _, a := range hub.hubAuth {
		if a != "Bearer hf_secret_token" {
			t.Fatalf("the Hub got Authorization %q", a)
		}
	}
	if hub.cdnGets < 3<<20/(64<<10) {
		t.Errorf("CDN served %d requests; want ranged GETs of 64 KiB", hub.cdnGets)
	}
	for _, a := range hub.cdnAuth {
		if a != "" {
			t.Fatalf("the CDN got Authorization %q", a)
		}
	}
	if len(hub.revCalls) != 1 || hub.revCalls[0] != "models:main" {
		t.Errorf("revision calls %v", hub.revCalls)
	}
}

func TestHubDatasetRevisionAndFilters(t *testing.T) {
	files, lfs := hubFiles()
	hub := newFakeHub(t, files, lfs)
	t.Setenv("HF_ENDPOINT", hub.hub.URL)
	t.Setenv("HF_TOKEN", "")
	opt := testOpts
	opt.Include = []string{"*.bin", "*.json"}
	opt.Exclude = []string{"sub/dir/"}
	src, err := Open(context.Background(), "hf://datasets/org/repo@"+hub.commit, opt)
	if err != nil {
		t.Fatal(err)
	}
	res, err := pushSource(t, src)
	if err != nil {
		t.Fatal(err)
	}
	checkIndex(t, res.Index, map[string][]byte{
		"config.json": files["config.json"], "weights.bin": files["weights.bin"], "sub/tokenizer.json": files["sub/tokenizer.json"],
	})
	if got := hub.revCalls; len(got) != 1 || got[0] != "datasets:"+hub.commit {
		t.Errorf("revision calls %v", got)
	}
}

func TestHubLFSMismatchFailsThePush(t *testing.T) {
	for _, p := range []string{"weights.bin", "sub/dir/small-lfs.z", "config.json"} {
		t.Run(p, func(t *testing.T) {
			files, lfs := hubFiles()
			hub := newFakeHub(t, files, lfs)
			bad := bytes.Clone(files[p])
			bad[len(bad)/2] ^= 1
			hub.served[p] = bad
			t.Setenv("HF_ENDPOINT", hub.hub.URL)
			src, err := Open(context.Background(), "hf://org/repo@main", testOpts)
			if err != nil {
				t.Fatal(err)
			}
			_, err = pushSource(t, src)
			if !errors.Is(err, ErrDigestMismatch) {
				t.Fatalf("push: %v, want a digest mismatch", err)
			}
			var me *MismatchError
			if !errors.As(err, &me) || me.Path != p || !strings.Contains(err.Error(), "hf://org/repo@main") {
				t.Fatalf("error %v does not name the source and %s", err, p)
			}
		})
	}
}

func TestHubErrorsNameTheSourceAndHideSecrets(t *testing.T) {
	files, lfs := hubFiles()
	hub := newFakeHub(t, files, lfs)
	t.Setenv("HF_ENDPOINT", hub.hub.URL)
	t.Setenv("HF_TOKEN", "hf_secret_token")
	src, err := Open(context.Background(), "hf://org/repo@nope", testOpts)
	if err != nil {
		t.Fatal(err)
	}
	_, err = src.Walk(context.Background())
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "hf://org/repo@nope") {
		t.Fatalf("walk: %v", err)
	}

	// A CDN that refuses: the error names the file but not the signature.
	hub.cdn.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "denied", http.StatusForbidden)
	})
	src, err = Open(context.Background(), "hf://org/repo", testOpts)
	if err != nil {
		t.Fatal(err)
	}
	_, err = pushSource(t, src)
	if err == nil {
		t.Fatal("push succeeded through a refusing CDN")
	}
	if msg := err.Error(); strings.Contains(msg, "secret") || !strings.Contains(msg, "403") {
		t.Fatalf("error %q: want a 403 without secrets", msg)
	}
	if _, err := Open(context.Background(), "hf://a/b/c", testOpts); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("hf://a/b/c: %v", err)
	}
}

func TestGCSListsPagesPinsGenerationsAndVerifiesMD5(t *testing.T) {
	objects := map[string][]byte{
		"data/a.bin":       randBytes(4, 700<<10),
		"data/sub/b.txt":   []byte("bee"),
		"data/sub/c.bin":   randBytes(5, 300<<10),
		"data/sub/":        {}, // a directory marker
		"database/ignored": []byte("not under data/"),
		"other/x":          []byte("single"),
	}
	g := newFakeGCS(t, objects)
	t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(g.srv.URL, "http://"))
	src, err := Open(context.Background(), "gs://b/data", testOpts)
	if err != nil {
		t.Fatal(err)
	}
	res, err := pushSource(t, src)
	if err != nil {
		t.Fatal(err)
	}
	checkIndex(t, res.Index, map[string][]byte{"a.bin": objects["data/a.bin"], "sub/b.txt": objects["data/sub/b.txt"], "sub/c.bin": objects["data/sub/c.bin"]})

	one, err := Open(context.Background(), "gs://b/other/x", testOpts)
	if err != nil {
		t.Fatal(err)
	}
	res, err = pushSource(t, one)
	if err != nil {
		t.Fatal(err)
	}
	checkIndex(t, res.Index, map[string][]byte{"x": objects["other/x"]})

	bad := bytes.Clone(objects["data/sub/c.bin"])
	bad[0] ^= 1
	g.served["data/sub/c.bin"] = bad
	src, _ = Open(context.Background(), "gs://b/data", testOpts)
	if _, err = pushSource(t, src); !errors.Is(err, ErrDigestMismatch) || !strings.Contains(err.Error(), "sub/c.bin") {
		t.Fatalf("push of a corrupt object: %v", err)
	}
}

func TestHTTPFileAndList(t *testing.T) {
	a, b := randBytes(6, 200<<10), []byte("hello")
	var noRange atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body []byte
		switch r.URL.Path {
		case "/files/model.bin":
			body = a
		case "/files/hello.txt":
			body = b
		case "/list.txt":
			sum := sha256.Sum256(a)
			fmt.Fprintf(w, "# weights\nfiles/model.bin weights/model.bin sha256:%x\n\n%s/files/hello.txt\n", sum, "http://"+r.Host)
			return
		default:
			http.NotFound(w, r)
			return
		}
		if noRange.Load() {
			r.Header.Del("Range")
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
	}))
	defer srv.Close()

	local := testOpts
	local.AllowPrivateNetwork = true // the server is on loopback
	for _, ranges := range []bool{true, false} {
		noRange.Store(!ranges)
		src, err := Open(context.Background(), srv.URL+"/files/model.bin", local)
		if err != nil {
			t.Fatal(err)
		}
		res, err := pushSource(t, src)
		if err != nil {
			t.Fatalf("ranges %v: %v", ranges, err)
		}
		checkIndex(t, res.Index, map[string][]byte{"model.bin": a})
	}
	noRange.Store(false)
	opt := local
	opt.List = true
	src, err := Open(context.Background(), srv.URL+"/list.txt", opt)
	if err != nil {
		t.Fatal(err)
	}
	res, err := pushSource(t, src)
	if err != nil {
		t.Fatal(err)
	}
	checkIndex(t, res.Index, map[string][]byte{"weights/model.bin": a, "hello.txt": b})

	if _, err := Open(context.Background(), "https://user:pw@example.com/f", testOpts); !errors.Is(err, ErrUnsupported) || strings.Contains(err.Error(), "pw") {
		t.Fatalf("URL with credentials: %v", err)
	}
	if _, err := Open(context.Background(), "https://example.com/f?X-Amz-Signature=s3cr3t", testOpts); !errors.Is(err, ErrUnsupported) || strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("signed URL: %v", err)
	}
	if _, err := Open(context.Background(), "ftp://example.com/f", testOpts); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("ftp: %v", err)
	}
}

func TestBlockReaderReadsAnyRangeAndBoundsReadahead(t *testing.T) {
	data := randBytes(7, 1<<20+333)
	var inFlight, maxInFlight atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	r := &blockReader{
		ctx: ctx, cancel: cancel, size: int64(len(data)), bs: 10000, ahead: 3,
		reqs: newSem(2), buffer: newSem(25000), blocks: map[int64]*block{}, name: "test",
		fetch: func(_ context.Context, off, n int64) ([]byte, error) {
			k := inFlight.Add(1)
			defer inFlight.Add(-1)
			for {
				m := maxInFlight.Load()
				if k <= m || maxInFlight.CompareAndSwap(m, k) {
					break
				}
			}
			return bytes.Clone(data[off : off+n]), nil
		},
	}
	defer r.Close()
	got := make([]byte, len(data))
	for off := 0; off < len(data); off += 4096 {
		n, err := r.ReadAt(got[off:min(off+4096, len(data))], int64(off))
		if err != nil && !(err == io.EOF && off+n == len(data)) {
			t.Fatalf("ReadAt %d: %d, %v", off, n, err)
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatal("sequential read differs")
	}
	p := make([]byte, 50000)
	n, err := r.ReadAt(p, 12345)
	if n != len(p) || err != nil || !bytes.Equal(p, data[12345:12345+50000]) {
		t.Fatalf("backward read: %d, %v", n, err)
	}
	n, err = r.ReadAt(p, int64(len(data)-10))
	if n != 10 || err != io.EOF {
		t.Fatalf("read past the end: %d, %v", n, err)
	}
	r.mu.Lock()
	blocks := len(r.blocks)
	r.mu.Unlock()
	if blocks > 4 {
		t.Errorf("%d blocks held, want at most readahead+1", blocks)
	}
	if m := maxInFlight.Load(); m > 2 {
		t.Errorf("%d range requests in flight, limit 2", m)
	}
}

func newSem(n int64) *semaphore.Weighted { return semaphore.NewWeighted(n) }
