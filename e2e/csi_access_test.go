package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
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
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
)

// forgingRegistry is a registry an attacker runs: every manifest HEAD and
// GET is answered 200 with Docker-Content-Digest: claimed, and it holds
// nothing else. Repository "big" sends a GET body over the 4 MiB manifest
// limit (a client that skips reading large manifests then takes the
// digest on trust); repository "leaked" sends manifest, the real bytes
// (an attacker who got hold of them); repository "crafted" sends crafted,
// with its own digest (a manifest an attacker wrote, naming another's
// blobs); the others send a small body that is not the manifest. Blob
// requests are answered 404: it holds no blob.
func forgingRegistry(t *testing.T, ip net.IP, ca testCA, claimed string, manifest, crafted []byte) *registry {
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
		case strings.HasPrefix(r.URL.Path, "/v2/crafted/"):
			body = crafted
		}
		w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
		w.Header().Set("Docker-Content-Digest", claimed)
		if strings.HasPrefix(r.URL.Path, "/v2/crafted/") {
			w.Header().Set("Docker-Content-Digest", digest.FromBytes(crafted).String())
		}
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
// is not served. The origin rule (docs/kubernetes.md, "What a pod can
// obtain"): D's real manifest bytes, or a manifest of the attacker's naming
// D's index and chunk digests, served from a registry holding no blob, read
// not one byte of D from the cache, while D is mounted and after its linger;
// a new pod of A's repository with A's secret reads D from the cache with no
// blob fetched.
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
	leaked := tlsManifest(t, reg.CA, copyRepo+"@"+d)
	evil := forgingRegistry(t, ip, reg.CA, d, leaked, craftedFrom(t, leaked))

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

	// Tenant A's manifest bytes, and a manifest naming A's blobs, from a
	// registry that holds none of them: no byte of A's files.
	tryStolen := func(when string, mounts int) {
		t.Helper()
		for _, ref := range []string{evil.Host + "/leaked@" + d, evil.Host + "/crafted:latest"} {
			evil.ResetStats()
			p := n.newPod("stolen-" + when + "-" + strings.Split(strings.TrimPrefix(ref, evil.Host+"/"), "@")[0])
			if err := n.publish(p, ref, ""); err == nil {
				for _, rel := range []string{"readme.txt", "big.bin", "données/模型.bin"} {
					if b, rerr := os.ReadFile(filepath.Join(p.target, rel)); rerr == nil {
						t.Errorf("%s: %s: a pod read %d bytes of tenant A's %s from the node's cache", when, ref, len(b), rel)
					}
				}
				n.unpublish(p)
			} else if _, err := os.Stat(p.target); !os.IsNotExist(err) {
				t.Errorf("%s: the refused publish of %s left %s: %v", when, ref, p.target, err)
			}
			if st := evil.Stats(); st.Requests["GET blob"]+st.Requests["HEAD blob"] == 0 {
				t.Errorf("%s: %s: the attacker's registry got no blob request (%v): A's blobs came from the cache", when, ref, st.Requests)
			}
		}
		if ms := n.fuseMounts(); len(ms) > mounts {
			t.Errorf("%s: FUSE mounts %v after the stolen manifests, want at most %d", when, ms, mounts)
		}
	}
	tryStolen("mounted", 1)
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

	tryStolen("after-linger", 0)

	// Another pod of A's repository, with A's secret, after the linger: a
	// new mount, read from the cache with no blob fetched.
	reg.ResetStats()
	a2 := n.newPod("tenant-a-again")
	n.mustPublish(a2, private+"@"+d, dockerConfig(reg.Host, user, pass))
	compareTrees(t, src, a2.target)
	if st := reg.Stats(); st.Requests["GET blob"] != 0 {
		t.Errorf("a second pod of A's repository fetched %d blobs (%v), want 0: the cache did not serve its own origin", st.Requests["GET blob"], st.BlobGets)
	}
	if err := n.unpublish(a2); err != nil {
		t.Fatal(err)
	}
}

// craftedFrom returns a manifest of the attacker's own: manifest with an
// annotation added, so that it names the same blobs under another digest.
func craftedFrom(t *testing.T, manifest []byte) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(manifest, &m); err != nil {
		t.Fatal(err)
	}
	ann, _ := m["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
	}
	ann["org.example.crafted"] = "yes"
	m["annotations"] = ann
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
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
