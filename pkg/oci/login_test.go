package oci

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"
)

func TestLogin(t *testing.T) {
	ctx := context.Background()
	var sawAuth bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); ok && u == "alice" && p == "right" {
			sawAuth = true
			w.WriteHeader(http.StatusOK)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")

	store := credentials.NewMemoryStore()
	opt := Options{Credentials: store, Retry: RetryPolicy{MaxAttempts: 1}}
	if err := Login(ctx, host, auth.Credential{Username: "alice", Password: "wrong"}, opt); err == nil ||
		!strings.Contains(err.Error(), host) || !strings.Contains(err.Error(), "alice") {
		t.Fatalf("login with a wrong password: %v; want an error naming the registry and user", err)
	}
	if c, _ := store.Get(ctx, host); c != auth.EmptyCredential {
		t.Fatalf("a refused login saved %+v", c)
	}
	if err := Login(ctx, host, auth.Credential{Username: "alice", Password: "right"}, opt); err != nil {
		t.Fatal(err)
	}
	if c, _ := store.Get(ctx, host); c.Username != "alice" || c.Password != "right" || !sawAuth {
		t.Errorf("saved %+v (registry saw the credential: %v)", c, sawAuth)
	}
	if err := Login(ctx, "bad host/x", auth.Credential{Username: "a", Password: "b"}, opt); !errors.Is(err, ErrInvalidRef) {
		t.Errorf("a malformed registry: %v", err)
	}
}
