package kubeclient

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"k8s.io/client-go/rest"
)

// get fetches path with the HTTP client client-go builds from cfg (its
// TLS, credentials and wrappers).
func get(t *testing.T, cfg *rest.Config, path string) ([]byte, error) {
	t.Helper()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(cfg.Host + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return b, err
}

// newServer answers /ok with a small body and /big with one larger than
// MaxResponseBytes, to requests that carry token.
func newServer(t *testing.T, token string) *httptest.Server {
	s := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/ok":
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Success"}`)
		case "/big":
			fmt.Fprint(w, `{"kind":"PodList","apiVersion":"v1","items":[],"x":"`)
			chunk := strings.Repeat("x", 1<<20)
			for i := 0; i <= MaxResponseBytes>>20; i++ {
				if _, err := fmt.Fprint(w, chunk); err != nil {
					return
				}
			}
			fmt.Fprint(w, `"}`)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// With no kubeconfig and in a pod, the configuration is the pod's own
// cluster through its service account's CA and token; a FIFO in the
// service account's place is refused, not opened.
func TestInCluster(t *testing.T) {
	s := newServer(t, "sa-token")
	sa := t.TempDir()
	os.WriteFile(filepath.Join(sa, "ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}), 0o600)
	os.WriteFile(filepath.Join(sa, "token"), []byte("sa-token"), 0o600)
	old := serviceAccountDir
	serviceAccountDir = sa
	t.Cleanup(func() { serviceAccountDir = old })
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	host, port, _ := strings.Cut(strings.TrimPrefix(s.URL, "https://"), ":")
	t.Setenv("KUBERNETES_SERVICE_HOST", host)
	t.Setenv("KUBERNETES_SERVICE_PORT", port)
	cfg, name, err := Config(context.Background(), "")
	if err != nil || name != InCluster {
		t.Fatalf("in-cluster: %q, %v", name, err)
	}
	if _, err := get(t, cfg, "/ok"); err != nil {
		t.Fatalf("in-cluster request: %v", err)
	}

	os.Remove(filepath.Join(sa, "token"))
	if err := syscall.Mkfifo(filepath.Join(sa, "token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Config(context.Background(), ""); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a FIFO token: %v", err)
	}
}

// A response body larger than MaxResponseBytes fails its read.
func TestResponseBounded(t *testing.T) {
	s := newServer(t, "t")
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}), 0o600)
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters:\n- name: c\n  cluster: {server: %q, certificate-authority: ca.crt}\n"+
		"contexts:\n- name: x\n  context: {cluster: c, user: u}\nusers:\n- name: u\n  user: {token: t}\n", s.URL)
	os.WriteFile(filepath.Join(dir, "config"), []byte(kc), 0o600)
	t.Setenv("KUBECONFIG", filepath.Join(dir, "config"))
	cfg, name, err := Config(context.Background(), "")
	if err != nil || name != "x" {
		t.Fatalf("%q, %v", name, err)
	}
	if _, err := get(t, cfg, "/ok"); err != nil {
		t.Fatal(err)
	}
	if b, err := get(t, cfg, "/big"); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a body over the bound: %d bytes, %v", len(b), err)
	}
}
