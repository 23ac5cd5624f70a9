package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/registry/handlers"
	"google.golang.org/grpc/codes"
)

// forgingRegistry is a registry an attacker runs: every manifest HEAD and
// GET is answered 200 with Docker-Content-Digest: claimed, and it holds
// nothing else. Repository "big" sends a GET body over the 4 MiB manifest
// limit (a client that skips reading large manifests then takes the
// digest on trust); repository "leaked" sends manifest, the real bytes
// (an attacker who got hold of them); the others send a small body that is
// not the manifest.
func forgingRegistry(t *testing.T, ip net.IP, ca testCA, claimed string, manifest []byte) *registry {
	t.Helper()
	return serveTLS(t, ip, ca.Server, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		if !strings.Contains(r.URL.Path, "/manifests/") {
			http.NotFound(w, r)
			return
		}
		body := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}`)
		switch {
		case strings.HasPrefix(r.URL.Path, "/v2/big/"):
			body = []byte(strings.Repeat(" ", 4<<20+1))
		case strings.HasPrefix(r.URL.Path, "/v2/leaked/"):
			body = manifest
		}
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		w.Header().Set("Docker-Content-Digest", claimed)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		if r.Method == http.MethodGet {
			w.Write(body)
		}
	}))
}

// TestCSIForgedDigest: tenant A publishes its private version D from a
// registry with auth; a pod with no secret naming D (by digest or by a tag)
// in a registry that only claims D is refused, with nothing bound, while D
// is mounted and after its linger with D's chunks in the node's cache. A
// second real registry holding the same manifest in another repository gets
// its own mount. The mounter's default /metrics does not list D, and /warm
// is not served. The documented limit holds too: D's real manifest bytes,
// served from a registry holding no blob, mount D from the cache.
func TestCSIForgedDigest(t *testing.T) {
	const user = "tenant-a"
	pass := "pw-tenant-a-" + strings.Repeat("3", 10)
	ip := net.IPv4(127, 0, 0, 1)
	reg := newAuthRegistry(t, ip, "htpasswd", user, pass)
	ca := []string{"--ca-file", reg.CA.File, "--tls"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	second := serveTLS(t, ip, reg.CA.Server, handlers.NewApp(ctx, distributionConfig(t.TempDir())))

	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, richTree(), time.Time{})
	private := reg.Host + "/tenant-a/private"
	res := runWith(t, pass+"\n", nil, append(append([]string{"login"}, ca...), reg.Host, "-u", user, "--password-stdin")...)
	if res.code != 0 {
		t.Fatalf("login:\n%s", res)
	}
	d := push(t, private, private+":v1", src, append(append([]string{}, ca...), smallChunks...)...)
	copyRepo := second.Host + "/other/copy"
	if d2 := push(t, copyRepo, copyRepo+":v1", src, append(append([]string{}, ca...), smallChunks...)...); d2 != d {
		t.Fatalf("the same tree pushed to a second registry is %s, not %s", d2, d)
	}
	os.Remove(filepath.Join(home(t), "config.json")) // the node has no credentials of its own
	evil := forgingRegistry(t, ip, reg.CA, d, tlsManifest(t, reg.CA, copyRepo+"@"+d))

	const linger = 1500 * time.Millisecond
	metricsAddr := freeAddr(t)
	n := startCSIWith(t, linger, "1GiB", []string{"--metrics-addr", metricsAddr}, ca...)
	a := n.newPod("tenant-a")
	n.mustPublish(a, private+":v1", dockerConfig(reg.Host, user, pass))
	compareTrees(t, src, a.target)

	forged := []struct {
		ref  string
		want codes.Code
	}{
		{evil.Host + "/x@" + d, codes.PermissionDenied},
		{evil.Host + "/x:latest", codes.PermissionDenied},
		{evil.Host + "/big@" + d, codes.InvalidArgument},
		{evil.Host + "/big:latest", codes.InvalidArgument},
	}
	tryForged := func(when string, mounts int) {
		t.Helper()
		for i, c := range forged {
			p := n.newPod("attacker-" + when + "-" + strconv.Itoa(i))
			err := n.publish(p, c.ref, "")
			if err == nil {
				got := "nothing readable"
				if b, rerr := os.ReadFile(filepath.Join(p.target, "readme.txt")); rerr == nil {
					got = "tenant A's readme.txt (" + strconv.Itoa(len(b)) + " bytes)"
				}
				t.Errorf("%s: a pod with no secret published %s: it reads %s", when, c.ref, got)
				n.unpublish(p)
				continue
			}
			if codeOf(err) != c.want || !strings.Contains(err.Error(), evil.Host) {
				t.Errorf("%s: %s: NodePublishVolume = %v, want %v naming the reference", when, c.ref, err, c.want)
			}
			if _, err := os.Stat(p.target); !os.IsNotExist(err) {
				t.Errorf("%s: the refused publish of %s left %s: %v", when, c.ref, p.target, err)
			}
		}
		if ms := n.fuseMounts(); len(ms) != mounts {
			t.Errorf("%s: FUSE mounts %v after the forged publishes, want %d", when, ms, mounts)
		}
	}
	tryForged("mounted", 1)
	compareTrees(t, src, a.target)

	// The same manifest in another registry and repository: its own mount.
	c := n.newPod("copy-reader")
	n.mustPublish(c, copyRepo+"@"+d, "")
	compareTrees(t, src, c.target)
	if ms := n.fuseMounts(); len(ms) != 2 {
		t.Errorf("one digest from two repositories: FUSE mounts %v, want 2", ms)
	}

	// The default scrape names no digest, and /warm is not served.
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	hex := strings.TrimPrefix(d, "sha256:")
	if resp.StatusCode != 200 || !strings.Contains(string(body), "bdnvol_mounts") {
		t.Errorf("scrape: %s, bdnvol_mounts in it: %v", resp.Status, strings.Contains(string(body), "bdnvol_mounts"))
	}
	if strings.Contains(string(body), hex) {
		t.Errorf("the default /metrics lists the mounted digest %s", d)
	}
	if resp, err := http.Get("http://" + metricsAddr + "/warm"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("/warm by default: %s, want 404", resp.Status)
		}
	}

	// After the linger, with D's chunks in the cache: still refused.
	for _, p := range []pod{a, c} {
		if err := n.unpublish(p); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(linger + 10*time.Second)
	for len(n.fuseMounts()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still mounted after the linger: %v", n.fuseMounts())
		}
		time.Sleep(50 * time.Millisecond)
	}
	var cached int
	filepath.Walk(n.cacheDir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			cached++
		}
		return nil
	})
	if cached == 0 {
		t.Fatal("nothing in the node's cache after the linger")
	}
	tryForged("after-linger", 0)

	// The documented limit (docs/kubernetes.md, "What a pod can obtain"):
	// a pod that has D's exact manifest bytes, served from a registry that
	// holds no blob of D, reads D's cached chunks.
	l := n.newPod("leaked-manifest")
	if err := n.publish(l, evil.Host+"/leaked@"+d, ""); err != nil {
		t.Fatalf("the manifest's own bytes from a registry holding no blob: %v; docs/kubernetes.md says this mounts from the cache", err)
	}
	compareTrees(t, src, l.target)
	if err := n.unpublish(l); err != nil {
		t.Fatal(err)
	}
}

// tlsManifest GETs the manifest of ref from a TLS registry the CA signed.
func tlsManifest(t *testing.T, ca testCA, ref string) []byte {
	t.Helper()
	pem, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	host, rest, _ := strings.Cut(ref, "/")
	repo, dg, _ := strings.Cut(rest, "@")
	req, _ := http.NewRequest(http.MethodGet, "https://"+host+"/v2/"+repo+"/manifests/"+dg, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET manifest %s: %s %v", ref, resp.Status, err)
	}
	return b
}
