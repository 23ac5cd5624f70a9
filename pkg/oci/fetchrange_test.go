package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"oras.land/oras-go/v2/content"
)

// TestFetchRange asks a server that honours Range, one that ignores it
// (200 with the whole blob) and one that answers another range; and reads
// a range from an OCI layout.
func TestFetchRange(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 4096)
	desc := content.NewDescriptorFromBytes("application/vnd.bdnvol.chunk.v1", data)
	ctx := context.Background()
	for _, mode := range []string{"honour", "ignore", "shifted"} {
		t.Run(mode, func(t *testing.T) {
			var gotRange string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !strings.HasSuffix(r.URL.Path, "/blobs/"+desc.Digest.String()) {
					http.NotFound(w, r)
					return
				}
				gotRange = r.Header.Get("Range")
				var a, b int
				fmt.Sscanf(gotRange, "bytes=%d-%d", &a, &b)
				switch mode {
				case "ignore":
					w.Write(data)
					return
				case "shifted":
					a, b = a+1, b+1
				}
				w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", a, b, len(data)))
				w.WriteHeader(http.StatusPartialContent)
				w.Write(data[a : b+1])
			}))
			defer srv.Close()
			ref, err := ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/test:v1")
			if err != nil {
				t.Fatal(err)
			}
			tg, err := Open(ctx, ref, Options{})
			if err != nil {
				t.Fatal(err)
			}
			rc, err := tg.(RangeFetcher).FetchRange(ctx, desc, 1000, 5000)
			if gotRange != "bytes=1000-5999" {
				t.Fatalf("sent Range %q, want a closed range", gotRange)
			}
			switch mode {
			case "honour":
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(rc)
				rc.Close()
				if !bytes.Equal(b, data[1000:6000]) {
					t.Fatal("wrong bytes")
				}
			case "ignore":
				if !errors.Is(err, ErrRangeUnsupported) || !errors.Is(err, errors.ErrUnsupported) {
					t.Fatalf("got %v, want ErrRangeUnsupported", err)
				}
			case "shifted":
				if err == nil || !strings.Contains(err.Error(), "Content-Range") {
					t.Fatalf("got %v, want an error about Content-Range", err)
				}
			}
		})
	}
	t.Run("layout", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "lay")
		ref, err := ParseRef("oci:" + dir + ":v1")
		if err != nil {
			t.Fatal(err)
		}
		tg, err := Open(ctx, ref, Options{CreateLayout: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := tg.Push(ctx, desc, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		rc, err := tg.(RangeFetcher).FetchRange(ctx, desc, 60000, 5536)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if !bytes.Equal(b, data[60000:]) {
			t.Fatal("wrong bytes from the layout")
		}
		if _, err := tg.(RangeFetcher).FetchRange(ctx, desc, 60000, 6000); err == nil {
			t.Fatal("a range past the blob's end was accepted")
		}
	})
}
