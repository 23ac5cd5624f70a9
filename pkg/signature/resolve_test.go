package signature

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/registry/remote/credentials"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// TestResolveLyingRegistry: Resolve, which pull and the node plugin's access
// check use, refuses a registry that answers a manifest HEAD and GET with a
// Docker-Content-Digest it does not hold, by digest and by tag.
func TestResolveLyingRegistry(t *testing.T) {
	victim := "sha256:" + strings.Repeat("5e", 32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		if !strings.Contains(r.URL.Path, "/manifests/") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
		w.Header().Set("Docker-Content-Digest", victim)
		w.Write([]byte(`{"schemaVersion":2}`))
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ctx := context.Background()
	for _, s := range []string{host + "/evil/x@" + victim, host + "/evil/x:tag"} {
		ref, err := oci.ParseRef(s)
		if err != nil {
			t.Fatal(err)
		}
		tg, err := oci.Open(ctx, ref, oci.Options{Credentials: credentials.NewMemoryStore(), Retry: oci.RetryPolicy{MaxAttempts: 1, Base: 1}})
		if err != nil {
			t.Fatal(err)
		}
		desc, err := Resolve(ctx, tg, ref, Policy{})
		if !errors.Is(err, oci.ErrMismatchedDigest) {
			t.Errorf("%s: Resolve = %s, %v; want ErrMismatchedDigest", s, desc.Digest, err)
		}
	}
}
