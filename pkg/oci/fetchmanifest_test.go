package oci

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote/credentials"
)

// TestFetchManifest: a tag resolves to its manifest's descriptor and bytes
// in one GET (no HEAD first); a manifest over the limit is refused; an
// unknown tag is ErrNotFound.
func TestFetchManifest(t *testing.T) {
	reg := quietRegistry()
	var mu sync.Mutex
	var reqs []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/manifests/") {
			mu.Lock()
			reqs = append(reqs, r.Method)
			mu.Unlock()
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	base, err := ParseRef(host + "/rb/vol")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tg, err := Open(ctx, base, Options{Credentials: credentials.NewMemoryStore(), Retry: RetryPolicy{Base: 1}})
	if err != nil {
		t.Fatal(err)
	}
	desc, b := pushManifest(t, tg, 3)
	if err := tg.Tag(ctx, desc, "v1"); err != nil {
		t.Fatal(err)
	}
	ref, err := ParseRef(host + "/rb/vol:v1")
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	reqs = nil
	mu.Unlock()
	got, gb, err := FetchManifest(ctx, tg, ref, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != desc.Digest || got.Size != desc.Size || !bytes.Equal(gb, b) {
		t.Fatalf("resolved %s (%d bytes, body %d bytes), want %s with its %d bytes", got.Digest, got.Size, len(gb), desc.Digest, len(b))
	}
	mu.Lock()
	if len(reqs) != 1 || reqs[0] != http.MethodGet {
		t.Errorf("manifest requests %v, want one GET", reqs)
	}
	mu.Unlock()
	if _, _, err := FetchManifest(ctx, tg, ref, 10); !errors.Is(err, ErrManifestTooLarge) {
		t.Errorf("over the limit: %v; want ErrManifestTooLarge", err)
	}
	byDigest, _ := ParseRef(host + "/rb/vol@" + desc.Digest.String())
	if got, gb, err := FetchManifest(ctx, tg, byDigest, 1<<20); err != nil || got.Digest != desc.Digest || !bytes.Equal(gb, b) {
		t.Errorf("by digest: %s, %d bytes, %v", got.Digest, len(gb), err)
	}
	missing, _ := ParseRef(host + "/rb/vol:nope")
	if _, _, err := FetchManifest(ctx, tg, missing, 1<<20); err == nil {
		t.Error("an unknown tag resolved")
	} else {
		wantNotFound(t, "unknown tag", err)
	}
}

// lyingRegistry answers every manifest HEAD and GET with 200 and a
// Docker-Content-Digest it does not hold: claimed. GET bodies are body,
// sent without a Content-Length when chunked (oras-go then asks a HEAD for
// the descriptor). It holds nothing else.
func lyingRegistry(t *testing.T, claimed string, body []byte, chunked bool) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		if !strings.Contains(r.URL.Path, "/manifests/") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
		w.Header().Set("Docker-Content-Digest", claimed)
		if r.Method == http.MethodHead {
			w.Header().Set("Content-Length", "100")
			return
		}
		if !chunked {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		}
		w.Write(body)
		if chunked {
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestFetchManifestLyingRegistry: a registry that claims a digest it does
// not hold (Docker-Content-Digest on HEAD and GET) is caught from the
// bytes, by digest and by tag, with and without a Content-Length; Resolve,
// which trusts the HEAD, is fooled.
func TestFetchManifestLyingRegistry(t *testing.T) {
	ctx := context.Background()
	// The victim's digest: named in pod specs, not held by this registry.
	victim := "sha256:" + strings.Repeat("5e", 32)
	for _, c := range []struct {
		name    string
		body    []byte
		chunked bool
	}{
		{"garbage", []byte(`{"schemaVersion":2}`), false},
		{"garbage-chunked", []byte(`{"schemaVersion":2}`), true},
		{"empty", nil, false},
	} {
		host := lyingRegistry(t, victim, c.body, c.chunked)
		opt := Options{Credentials: credentials.NewMemoryStore(), Retry: RetryPolicy{MaxAttempts: 1, Base: 1}}
		for _, s := range []string{host + "/evil/x@" + victim, host + "/evil/x:latest"} {
			ref, err := ParseRef(s)
			if err != nil {
				t.Fatal(err)
			}
			tg, err := Open(ctx, ref, opt)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := Resolve(ctx, tg, ref); err != nil || got.Digest.String() != victim {
				t.Errorf("%s %s: Resolve (a HEAD) = %s, %v; the test's registry should fool it", c.name, s, got.Digest, err)
			}
			got, b, err := FetchManifest(ctx, tg, ref, 1<<20)
			if !errors.Is(err, ErrMismatchedDigest) {
				t.Errorf("%s %s: FetchManifest = %s (%d bytes), %v; want ErrMismatchedDigest", c.name, s, got.Digest, len(b), err)
			}
		}
	}
}
