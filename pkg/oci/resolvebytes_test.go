package oci

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"oras.land/oras-go/v2/registry/remote/credentials"
)

// TestResolveBytes: a tag resolves to its manifest's descriptor and bytes
// in one GET (no HEAD first); a manifest over the limit resolves without
// its bytes; an unknown tag is ErrNotFound.
func TestResolveBytes(t *testing.T) {
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
	got, gb, err := ResolveBytes(ctx, tg, ref, 1<<20)
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
	got, gb, err = ResolveBytes(ctx, tg, ref, 10)
	if err != nil || got.Digest != desc.Digest || gb != nil {
		t.Errorf("over the limit: %s, %d bytes, %v; want the descriptor without bytes", got.Digest, len(gb), err)
	}
	missing, _ := ParseRef(host + "/rb/vol:nope")
	if _, _, err := ResolveBytes(ctx, tg, missing, 1<<20); err == nil {
		t.Error("an unknown tag resolved")
	} else {
		wantNotFound(t, "unknown tag", err)
	}
}
