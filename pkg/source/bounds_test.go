package source

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Sizes come from the source: a negative (or absurd) one from a Hub
// listing, a Content-Range or an S3 listing fails the sync with an error
// naming it, where it used to panic in makeslice.
func TestOutOfRangeSizesFailTheSync(t *testing.T) {
	for _, tc := range []struct {
		file string
		size int64
	}{{"config.json", -5}, {"weights.bin", -5}, {"sub/dir/small-lfs.z", 1 << 60}} {
		t.Run(fmt.Sprintf("hub %s %d", tc.file, tc.size), func(t *testing.T) {
			files, lfs := hubFiles()
			hub := newFakeHub(t, files, lfs)
			hub.sizes = map[string]int64{tc.file: tc.size}
			t.Setenv("HF_ENDPOINT", hub.hub.URL)
			src, err := Open(context.Background(), "hf://org/repo", testOpts)
			if err != nil {
				t.Fatal(err)
			}
			_, err = pushSource(t, src)
			want := fmt.Sprintf("size %d is out of range", tc.size)
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tc.file) {
				t.Fatalf("push: %v, want %q naming %s", err, want, tc.file)
			}
			t.Log(err)
		})
	}

	t.Run("content-range", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodHead {
				w.WriteHeader(http.StatusMethodNotAllowed)
				return
			}
			w.Header().Set("Content-Range", "bytes 0-0/-5")
			w.WriteHeader(http.StatusPartialContent)
			w.Write([]byte("x"))
		}))
		defer srv.Close()
		opt := testOpts
		opt.AllowPrivateNetwork = true
		src, err := Open(context.Background(), srv.URL+"/f.bin", opt)
		if err != nil {
			t.Fatal(err)
		}
		if _, err = pushSource(t, src); err == nil || !strings.Contains(err.Error(), "size -5 is out of range") {
			t.Fatalf("push: %v, want size -5 refused", err)
		}
	})

	t.Run("s3 listing", func(t *testing.T) {
		s3 := newFakeS3(t, map[string]int64{"data/a.bin": -5})
		opt := testOpts
		opt.Endpoint = s3.srv.URL
		src, err := Open(context.Background(), "s3://b/data", opt)
		if err != nil {
			t.Fatal(err)
		}
		if _, err = pushSource(t, src); err == nil || !strings.Contains(err.Error(), "size -5 is out of range") {
			t.Fatalf("push: %v, want size -5 refused", err)
		}
	})
}

// A listing whose pagination loops is refused when a page cursor comes
// back (it used to be followed 100,000 pages on the Hub, and for ever on
// GCS and S3), and an endless one stops at maxListPages.
func TestPaginationThatLoopsIsDetected(t *testing.T) {
	walk := func(t *testing.T, uri string, opt Options) error {
		t.Helper()
		src, err := Open(context.Background(), uri, opt)
		if err != nil {
			t.Fatal(err)
		}
		_, err = src.Walk(context.Background())
		return err
	}
	t.Run("hub", func(t *testing.T) {
		files, lfs := hubFiles()
		hub := newFakeHub(t, files, lfs)
		hub.paging = "loop"
		t.Setenv("HF_ENDPOINT", hub.hub.URL)
		err := walk(t, "hf://org/repo", testOpts)
		if err == nil || !strings.Contains(err.Error(), "pagination loops") {
			t.Fatalf("walk: %v, want the loop detected", err)
		}
		t.Log(err)
		if n := hub.treePages.Load(); n != 2 {
			t.Errorf("%d tree pages requested, want 2", n)
		}
	})
	t.Run("hub endless", func(t *testing.T) {
		defer func(n int) { maxListPages = n }(maxListPages)
		maxListPages = 50
		files, lfs := hubFiles()
		hub := newFakeHub(t, files, lfs)
		hub.paging = "endless"
		t.Setenv("HF_ENDPOINT", hub.hub.URL)
		err := walk(t, "hf://org/repo", testOpts)
		if err == nil || !strings.Contains(err.Error(), "more than 50 pages") {
			t.Fatalf("walk: %v, want the page bound", err)
		}
		if n := hub.treePages.Load(); n != 50 {
			t.Errorf("%d tree pages requested, want 50", n)
		}
	})
	t.Run("gcs", func(t *testing.T) {
		g := newFakeGCS(t, map[string][]byte{"data/a": []byte("a")})
		g.loop = true
		t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(g.srv.URL, "http://"))
		err := walk(t, "gs://b/data", testOpts)
		if err == nil || !strings.Contains(err.Error(), "pagination loops") {
			t.Fatalf("walk: %v, want the loop detected", err)
		}
		if n := g.listPages.Load(); n != 2 {
			t.Errorf("%d listing pages requested, want 2", n)
		}
	})
	t.Run("s3", func(t *testing.T) {
		s3 := newFakeS3(t, map[string]int64{"data/a.bin": 1})
		s3.loop = true
		opt := testOpts
		opt.Endpoint = s3.srv.URL
		err := walk(t, "s3://b/data", opt)
		if err == nil || !strings.Contains(err.Error(), "pagination loops") {
			t.Fatalf("walk: %v, want the loop detected", err)
		}
		if n := s3.listPages.Load(); n != 2 {
			t.Errorf("%d listing pages requested, want 2", n)
		}
	})
}

// Listing answers are read into memory only up to MaxListingBody.
func TestListingBodiesAreBounded(t *testing.T) {
	big := strings.Repeat("# a comment line that lists nothing at all, to fill the body\n", MaxListingBody/60+2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, big)
	}))
	defer srv.Close()
	opt := testOpts
	opt.AllowPrivateNetwork = true
	opt.List = true
	src, err := Open(context.Background(), srv.URL+"/list.txt", opt)
	if err != nil {
		t.Fatal(err)
	}
	_, err = src.Walk(context.Background())
	if err == nil || !strings.Contains(err.Error(), "exceeds 64 MiB") || errors.Is(err, ErrEmpty) {
		t.Fatalf("walk of a %d-byte list: %v, want the size bound", len(big), err)
	}

	files, lfs := hubFiles()
	hub := newFakeHub(t, files, lfs)
	hub.hub.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/revision/") {
			fmt.Fprintf(w, `{"sha":"%s","padding":"%s"}`, hub.commit, strings.Repeat("x", MaxListingBody))
			return
		}
		http.NotFound(w, r)
	})
	t.Setenv("HF_ENDPOINT", hub.hub.URL)
	src, err = Open(context.Background(), "hf://org/repo", testOpts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = src.Walk(context.Background()); err == nil || !strings.Contains(err.Error(), "exceeds 64 MiB") {
		t.Fatalf("walk of a Hub with a huge answer: %v, want the size bound", err)
	}
}
