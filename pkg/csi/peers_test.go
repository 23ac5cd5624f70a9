package csi

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/clusterpeers"
	"github.com/bdnvol/bdnvol/pkg/metrics"
)

// tlsDir writes ca.crt and a mounter certificate of ca into a new directory.
func tlsDir(t *testing.T, ca *clusterpeers.CA) string {
	t.Helper()
	dir := t.TempDir()
	caPEM, _, err := ca.PEM()
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.Issue("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509MarshalEC(c)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"ca.crt":  caPEM,
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}),
		"tls.key": kb,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestPeerServerMutualTLS: the peer server answers only a client with a
// certificate of the cluster CA; one of another CA, or none, is refused in
// the handshake.
func TestPeerServerMutualTLS(t *testing.T) {
	ca, err := clusterpeers.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := clusterpeers.NewCA()
	cache, err := chunkcache.Open(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := startPeers(ctx, PeerConfig{Listen: addr, TLSDir: tlsDir(t, ca)}, cache, metrics.New(), slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	get := func(cert *tls.Certificate) (int, error) {
		cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		r, err := c.Get("https://" + addr + "/v2/team/m/blobs/sha256:" + strings.Repeat("a", 64) + "?ns=r.example&size=1")
		if err != nil {
			return 0, err
		}
		r.Body.Close()
		return r.StatusCode, nil
	}
	good, _ := ca.Issue("127.0.0.2")
	bad, _ := other.Issue("127.0.0.2")
	var code int
	for range 50 { // the server starts in the background
		if code, err = get(good); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || code != http.StatusNotFound {
		t.Fatalf("a mounter of the CA: %d, %v; want 404 (the chunk is not held)", code, err)
	}
	for name, cert := range map[string]*tls.Certificate{"another CA's": bad, "no": nil} {
		if code, err := get(cert); err == nil {
			t.Errorf("a client with %s certificate got an answer: %d", name, code)
		}
	}
	// The TLS choices exclude one another, and one is required.
	for _, c := range []PeerConfig{{Listen: "127.0.0.1:0"}, {Listen: "127.0.0.1:0", Insecure: true, TLSDir: "x"},
		{Listen: "127.0.0.1:0", Insecure: true, Peers: []string{"a:1"}, Service: "ns/svc"}} {
		if _, err := startPeers(ctx, c, cache, metrics.New(), slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
			t.Errorf("%+v was accepted", c)
		}
	}
}

// x509MarshalEC is the PEM of c's EC private key.
func x509MarshalEC(c *tls.Certificate) ([]byte, error) {
	k, ok := c.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, errors.New("not an EC key")
	}
	b, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: b}), nil
}
