package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// CosignVersion is the cosign CLI the interop tests run; `make cosign`
// installs the same one.
const CosignVersion = "v2.6.5"

// cosignTool is the cosign CLI ($BDNVOL_COSIGN, else installed once).
var cosignTool = &goTool{name: "cosign", pkg: "github.com/sigstore/cosign/v2/cmd/cosign", version: CosignVersion, env: "BDNVOL_COSIGN"}

// cosign returns the path of the cosign CLI, installing it with go install
// when it is not there yet (minutes, once).
func cosign(t testing.TB) string { return cosignTool.path(t) }

// runCosign runs the cosign CLI offline: no transparency log, no TUF
// root fetch, with COSIGN_PASSWORD for the keys.
func runCosign(t testing.TB, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cosign(t), args...)
	h := t.TempDir()
	cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=e2e-pass", "HOME="+h, "DOCKER_CONFIG="+h,
		"TUF_ROOT="+filepath.Join(h, "tuf"), "SIGSTORE_NO_CACHE=true")
	cmd.Dir = h
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// keyPair makes a cosign key pair named name in dir with cosign itself and
// returns the private and public key paths.
func keyPair(t testing.TB, dir, name string) (string, string) {
	t.Helper()
	prefix := filepath.Join(dir, name)
	if out, err := runCosign(t, "generate-key-pair", "--output-key-prefix", prefix); err != nil {
		t.Fatalf("cosign generate-key-pair: %v\n%s", err, out)
	}
	return prefix + ".key", prefix + ".pub"
}

// signEnv runs the CLI with COSIGN_PASSWORD set for the test keys.
func signRun(t testing.TB, args ...string) result {
	t.Helper()
	t.Setenv("COSIGN_PASSWORD", "e2e-pass")
	return run(t, args...)
}

func smallVolume(t testing.TB, seed int) string {
	t.Helper()
	dir := t.TempDir()
	for i := 0; i < 3; i++ {
		b := bytes.Repeat([]byte(fmt.Sprintf("seed %d file %d ", seed, i)), 20000)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d.bin", i)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestSignCosignInterop signs with bdnvol and verifies with cosign and
// bdnvol, and signs with cosign and verifies with bdnvol, on distribution
// (tag scheme) and go-containerregistry's registry.
func TestSignCosignInterop(t *testing.T) {
	keys := t.TempDir()
	key, pub := keyPair(t, keys, "release")
	_, otherPub := keyPair(t, keys, "other")
	// distribution has no referrers API (signatures go under the tag
	// scheme only); ggcr-referrers serves it (bdnvol writes a referrer too).
	for _, kind := range []string{"distribution", "ggcr-referrers"} {
		t.Run(kind, func(t *testing.T) {
			api := kind == "ggcr-referrers"
			reg := newDistribution(t)
			if api {
				reg = newGGCRReferrers(t)
			}
			repo := reg.Host + "/models/sig"
			v1 := pushJSON(t, repo+":v1", smallVolume(t, 1))
			pinned1 := repo + "@" + v1.Digest

			res := signRun(t, "sign", "--key", key, repo+":v1")
			if res.code != 0 {
				t.Fatalf("bdnvol sign:\n%s", res)
			}
			if out, err := runCosign(t, "verify", "--key", pub, "--insecure-ignore-tlog=true",
				"--allow-http-registry", "--allow-insecure-registry", pinned1); err != nil {
				t.Fatalf("cosign verify of a bdnvol signature: %v\n%s", err, out)
			}
			if refs := sigReferrers(t, reg, "models/sig", v1.Digest); api && len(refs) != 1 {
				t.Fatalf("signature referrers of %s listed by the referrers API: %v, want 1", v1.Digest, refs)
			}
			if out, err := runCosign(t, "verify", "--key", pub, "--insecure-ignore-tlog=true", "--experimental-oci11",
				"--allow-http-registry", "--allow-insecure-registry", pinned1); err != nil {
				t.Fatalf("cosign verify --experimental-oci11 of a bdnvol signature: %v\n%s", err, out)
			}
			if res := run(t, "verify", "--key", pub, repo+":v1"); res.code != 0 || !strings.Contains(res.stdout, "verified") {
				t.Fatalf("bdnvol verify:\n%s", res)
			}
			if out, err := runCosign(t, "verify", "--key", otherPub, "--insecure-ignore-tlog=true",
				"--allow-http-registry", "--allow-insecure-registry", pinned1); err == nil {
				t.Fatalf("cosign verify with another key passed:\n%s", out)
			}

			v2 := pushJSON(t, repo+":v2", smallVolume(t, 2))
			pinned2 := repo + "@" + v2.Digest
			if out, err := runCosign(t, "sign", "--key", key, "--tlog-upload=false", "--yes",
				"--allow-http-registry", "--allow-insecure-registry", pinned2); err != nil {
				t.Fatalf("cosign sign: %v\n%s", err, out)
			}
			res = run(t, "verify", "--key", pub, "--json", pinned2)
			if res.code != 0 {
				t.Fatalf("bdnvol verify of a cosign signature:\n%s", res)
			}
			var v struct {
				Digest string `json:"digest"`
				Key    string `json:"key"`
			}
			mustJSON(t, []byte(res.stdout), &v)
			if v.Digest != v2.Digest || len(v.Key) != 64 {
				t.Errorf("verify --json: %+v", v)
			}
			res = run(t, "verify", "--key", otherPub, pinned2)
			if res.code == 0 || !strings.Contains(res.stderr, "signed by another key") || !strings.Contains(res.stderr, v2.Digest) {
				t.Fatalf("verify with another key:\n%s", res)
			}
			// cosign's OCI 1.1 mode stores the signature as a referrer of
			// the version (the registry's referrers API, or the referrers
			// tag scheme): bdnvol finds it there.
			v3 := pushJSON(t, repo+":v3", smallVolume(t, 3))
			pinned3 := repo + "@" + v3.Digest
			t.Setenv("COSIGN_EXPERIMENTAL", "1")
			if out, err := runCosign(t, "sign", "--key", key, "--tlog-upload=false", "--yes", "--registry-referrers-mode=oci-1-1",
				"--allow-http-registry", "--allow-insecure-registry", pinned3); err != nil {
				t.Fatalf("cosign sign (referrer): %v\n%s", err, out)
			}
			res = run(t, "verify", "--key", pub, "--json", pinned3)
			var rv struct {
				Referrer bool `json:"referrer"`
			}
			if res.code != 0 {
				t.Fatalf("bdnvol verify of a referrer signature:\n%s", res)
			}
			mustJSON(t, []byte(res.stdout), &rv)
			if !rv.Referrer {
				t.Errorf("signature of %s not found as a referrer: %s", v3.Digest, res.stdout)
			}
			if res := run(t, "verify", "--key", otherPub, pinned3); res.code == 0 || !strings.Contains(res.stderr, "signed by another key") {
				t.Fatalf("verify of a referrer signature with another key:\n%s", res)
			}
			if err := os.Unsetenv("COSIGN_EXPERIMENTAL"); err != nil {
				t.Fatal(err)
			}

			// versions shows the signed ones, and with --key as verified.
			res = mustRun(t, "versions", "--key", pub, "--json", repo)
			var vs []struct {
				Digest    string `json:"digest"`
				Signature struct {
					Signed   bool   `json:"signed"`
					Verified string `json:"verified_key"`
				} `json:"signature"`
			}
			mustJSON(t, []byte(res.stdout), &vs)
			if len(vs) != 3 {
				t.Fatalf("versions: %s", res.stdout)
			}
			for _, x := range vs {
				if x.Signature.Verified != v.Key {
					t.Errorf("versions: %s: %+v", x.Digest, x.Signature)
				}
			}
			if !api {
				return
			}
			// The referrer alone carries v1's signature: with v2's signature
			// manifest copied over v1's signature tag, cosign's tag path
			// fails, its OCI 1.1 path and bdnvol (which reads both) pass.
			putManifest(t, reg, "models/sig", sigTag(v1.Digest), "application/vnd.oci.image.manifest.v1+json",
				registryManifest(t, reg, "models/sig", sigTag(v2.Digest)))
			if out, err := runCosign(t, "verify", "--key", pub, "--insecure-ignore-tlog=true",
				"--allow-http-registry", "--allow-insecure-registry", pinned1); err == nil {
				t.Fatalf("cosign verify by tag of a copied signature passed:\n%s", out)
			}
			if out, err := runCosign(t, "verify", "--key", pub, "--insecure-ignore-tlog=true", "--experimental-oci11",
				"--allow-http-registry", "--allow-insecure-registry", pinned1); err != nil {
				t.Fatalf("cosign verify --experimental-oci11 of bdnvol's referrer: %v\n%s", err, out)
			}
			res = run(t, "verify", "--key", pub, "--json", pinned1)
			rv.Referrer = false
			if res.code != 0 {
				t.Fatalf("bdnvol verify with the tag's signature copied from another version:\n%s", res)
			}
			mustJSON(t, []byte(res.stdout), &rv)
			if !rv.Referrer {
				t.Errorf("signature of %s not verified from its referrer: %s", v1.Digest, res.stdout)
			}
		})
	}
}

// sigReferrers lists the cosign signature referrers of d in name through
// the registry's referrers API.
func sigReferrers(t testing.TB, reg *registry, name, d string) []string {
	return listReferrers(t, reg, name, d, "application/vnd.dev.cosign.artifact.sig.v1+json")
}

// listReferrers lists the referrers of d in name of the artifact type
// (any, if empty) through the registry's referrers API.
func listReferrers(t testing.TB, reg *registry, name, d, artifactType string) []string {
	t.Helper()
	u := reg.URL + "/v2/" + name + "/referrers/" + d
	if artifactType != "" {
		u += "?artifactType=" + url.QueryEscape(artifactType)
	}
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	var idx struct {
		Manifests []struct {
			Digest       string `json:"digest"`
			ArtifactType string `json:"artifactType"`
		} `json:"manifests"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&idx); err != nil {
		t.Fatalf("referrers of %s: %s: %v", d, resp.Status, err)
	}
	var out []string
	for _, m := range idx.Manifests {
		if artifactType == "" || m.ArtifactType == artifactType {
			out = append(out, m.Digest)
		}
	}
	return out
}

// registryManifest GETs a manifest of name by tag or digest.
func registryManifest(t testing.TB, reg *registry, name, ref string) []byte {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, reg.URL+"/v2/"+name+"/manifests/"+ref, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET manifest %s: %s\n%s", ref, resp.Status, b)
	}
	return b
}

func sigTag(d string) string { return strings.Replace(d, ":", "-", 1) + ".sig" }

// tamperSignature flips a bit of the first signature in d's signature tag
// manifest in name (the key id it claims stays).
func tamperSignature(t testing.TB, reg *registry, name, d string) {
	t.Helper()
	var m map[string]any
	mustJSON(t, registryManifest(t, reg, name, sigTag(d)), &m)
	layer := m["layers"].([]any)[0].(map[string]any)
	ann := layer["annotations"].(map[string]any)
	sig, _ := base64.StdEncoding.DecodeString(ann["dev.cosignproject.cosign/signature"].(string))
	sig[len(sig)/2] ^= 0x40
	ann["dev.cosignproject.cosign/signature"] = base64.StdEncoding.EncodeToString(sig)
	mb, _ := json.Marshal(m)
	putManifest(t, reg, name, sigTag(d), "application/vnd.oci.image.manifest.v1+json", mb)
}

// TestRequireSignature: pull, mount and bdnvol.yaml mounts refuse an
// unsigned version, one signed by another key, one whose signature names
// another digest and one whose signature was tampered with, each before
// the file index or any chunk is fetched; a version signed by the key is
// used.
func TestRequireSignature(t *testing.T) {
	keys := t.TempDir()
	key, pub := keyPair(t, keys, "release")
	otherKey, _ := keyPair(t, keys, "other")
	reg := newDistribution(t)
	proxy := newFaultProxy(t, reg)
	name := "models/req"
	repo := proxy.Host + "/" + name
	var ds [5]string
	for i := range ds {
		ds[i] = pushJSON(t, fmt.Sprintf("%s:v%d", repo, i), smallVolume(t, 10+i)).Digest
	}
	good, unsigned, other, copied, tampered := ds[0], ds[1], ds[2], ds[3], ds[4]
	for _, d := range []string{good, copied, tampered} {
		if res := signRun(t, "sign", "--key", key, repo+"@"+d); res.code != 0 {
			t.Fatalf("sign:\n%s", res)
		}
	}
	if res := signRun(t, "sign", "--key", otherKey, repo+"@"+other); res.code != 0 {
		t.Fatalf("sign:\n%s", res)
	}
	// The signature of good put under copied's tag; tampered's signature
	// bytes changed.
	putManifest(t, reg, name, sigTag(copied), "application/vnd.oci.image.manifest.v1+json", registryManifest(t, reg, name, sigTag(good)))
	tamperSignature(t, reg, name, tampered)

	cases := []struct {
		digest, why string
	}{
		{unsigned, "no signature"},
		{other, "signed by another key"},
		{copied, "signature of another digest"},
		{tampered, "tampered"},
	}
	checkRefused := func(t *testing.T, what string, res result, d, why string) {
		t.Helper()
		if res.code == 0 || !strings.Contains(res.stderr, d) || !strings.Contains(res.stderr, why) {
			t.Fatalf("%s of %s: want a refusal naming the digest and %q:\n%s", what, d, why, res)
		}
		// At most the signature payload was fetched: no index, no chunk.
		if gets := proxy.blobGets(); len(gets) > 1 {
			t.Fatalf("%s of %s: %d blobs fetched before the refusal: %v", what, d, len(gets), gets)
		}
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.why, " ", "-"), func(t *testing.T) {
			proxy.Set(faultConfig{})
			dst := filepath.Join(t.TempDir(), "out")
			checkRefused(t, "pull", run(t, "pull", "--require-signature", pub, repo+"@"+c.digest, dst), c.digest, c.why)
			if _, err := os.Stat(filepath.Join(dst, "f0.bin")); err == nil {
				t.Fatalf("pull wrote files of a refused version")
			}
			proxy.Set(faultConfig{})
			_, res := tryMount(t, repo+"@"+c.digest, "--require-signature", pub)
			checkRefused(t, "mount", res, c.digest, c.why)

			proxy.Set(faultConfig{})
			specDir := t.TempDir()
			if err := os.WriteFile(filepath.Join(specDir, "release.pub"), mustRead(t, pub), 0o644); err != nil {
				t.Fatal(err)
			}
			spec := fmt.Sprintf("requireSignature: release.pub\nmounts:\n  - source: %s@%s\n    path: /models/m\n    readOnly: true\n", repo, c.digest)
			specFile := filepath.Join(specDir, "bdnvol.yaml")
			if err := os.WriteFile(specFile, []byte(spec), 0o644); err != nil {
				t.Fatal(err)
			}
			requireFUSE(t)
			root := t.TempDir()
			t.Cleanup(func() { forceUnmount(t, filepath.Join(root, "models", "m")) })
			checkRefused(t, "mount --spec", run(t, "mount", "--daemon", "--spec", specFile, root), c.digest, c.why)
		})
	}
	t.Run("signed", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "out")
		if res := run(t, "pull", "--require-signature", pub, repo+":v0", dst); res.code != 0 {
			t.Fatalf("pull of a signed version:\n%s", res)
		}
		mp, res := tryMount(t, repo+":v0", "--require-signature", pub)
		if res.code != 0 {
			t.Fatalf("mount of a signed version:\n%s", res)
		}
		if b, err := os.ReadFile(filepath.Join(mp, "f0.bin")); err != nil || !bytes.Equal(b, mustRead(t, filepath.Join(dst, "f0.bin"))) {
			t.Fatalf("read through the mount: %v", err)
		}
	})
}

func mustRead(t testing.TB, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSignatureCost: verifying a signature reads the root manifest, the
// signature tag and manifest and its payload (plus a referrers lookup), whatever
// the volume's size; a pull re-hashes every byte. The times are logged for
// docs/signing.md, not asserted.
func TestSignatureCost(t *testing.T) {
	keys := t.TempDir()
	key, pub := keyPair(t, keys, "release")
	reg := newDistribution(t)
	repo := reg.Host + "/models/cost"
	dir := t.TempDir()
	const files, size = 4, 32 << 20
	for i := 0; i < files; i++ {
		b := make([]byte, size)
		for j := 0; j < len(b); j += 4096 {
			copy(b[j:], fmt.Sprintf("file %d block %d ", i, j))
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("w%d.bin", i)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	v := pushJSON(t, repo+":v1", dir)
	if res := signRun(t, "sign", "--key", key, repo+":v1"); res.code != 0 {
		t.Fatalf("sign:\n%s", res)
	}
	reg.ResetStats()
	start := time.Now()
	if res := run(t, "verify", "--key", pub, repo+"@"+v.Digest); res.code != 0 {
		t.Fatalf("verify:\n%s", res)
	}
	verifyMS := time.Since(start).Milliseconds()
	st := reg.Stats()
	n := 0
	for k, c := range st.Requests {
		if k != "GET base" {
			n += c
		}
	}
	if n > 8 || st.BlobBytesOut > 64<<10 {
		t.Errorf("verify: %d requests %v, %d blob bytes", n, st.Requests, st.BlobBytesOut)
	}
	reg.ResetStats()
	start = time.Now()
	if res := run(t, "pull", "--no-cache", repo+"@"+v.Digest, filepath.Join(t.TempDir(), "out")); res.code != 0 {
		t.Fatalf("pull:\n%s", res)
	}
	pullMS := time.Since(start).Milliseconds()
	pst := reg.Stats()
	pn := 0
	for _, c := range pst.Requests {
		pn += c
	}
	t.Logf("verify signature: %d requests, %d blob bytes, %d ms; pull (re-hash) of %d MiB: %d requests, %d blob bytes, %d ms",
		n, st.BlobBytesOut, verifyMS, files*size>>20, pn, pst.BlobBytesOut, pullMS)
}

// TestCSIRequireSignature: the node plugin refuses to publish a version
// without a valid signature by the key the volume attribute names (inline
// PEM or a path on the node): unsigned, signed by another key, or with a
// tampered signature, before mounting it; it publishes a signed one.
func TestCSIRequireSignature(t *testing.T) {
	keys := t.TempDir()
	key, pub := keyPair(t, keys, "release")
	otherKey, _ := keyPair(t, keys, "other")
	reg := newDistribution(t)
	name := "vols/signed"
	repo := reg.Host + "/" + name
	signed := pushJSON(t, repo+":v1", smallVolume(t, 21)).Digest
	unsigned := pushJSON(t, repo+":v2", smallVolume(t, 22)).Digest
	other := pushJSON(t, repo+":v3", smallVolume(t, 23)).Digest
	tampered := pushJSON(t, repo+":v4", smallVolume(t, 24)).Digest
	for _, s := range []struct{ key, d string }{{key, signed}, {otherKey, other}, {key, tampered}} {
		if res := signRun(t, "sign", "--key", s.key, repo+"@"+s.d); res.code != 0 {
			t.Fatalf("sign:\n%s", res)
		}
	}
	tamperSignature(t, reg, name, tampered)
	n := startCSI(t, time.Minute)
	n.restartNodeWith("--key-dir", keys)
	publish := func(p pod, ref, require string) error {
		return csiPublishRequiring(n, p, ref, require, 2*time.Minute)
	}
	inline := string(mustRead(t, pub))
	for _, c := range []struct{ tag, d, why string }{
		{"v2", unsigned, "no signature"},
		{"v3", other, "signed by another key"},
		{"v4", tampered, "tampered"},
	} {
		err := publish(n.newPod(c.tag), repo+":"+c.tag, inline)
		if codeOf(err) != codes.PermissionDenied || !strings.Contains(err.Error(), c.d) || !strings.Contains(err.Error(), c.why) {
			t.Fatalf("publish of %s: %v; want PermissionDenied naming %s and %q", c.tag, err, c.d, c.why)
		}
		if m := n.fuseMounts(); len(m) != 0 {
			t.Fatalf("mounts after refusing %s: %v", c.tag, m)
		}
	}
	if err := publish(n.newPod("bad-key"), repo+":v1", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"); codeOf(err) != codes.InvalidArgument {
		t.Fatalf("publish with a broken inline key: %v", err)
	}
	// A key file outside the key directory is refused.
	outside := filepath.Join(t.TempDir(), "release.pub")
	if err := os.WriteFile(outside, mustRead(t, pub), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := publish(n.newPod("outside"), repo+":v1", outside); codeOf(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "key directory") {
		t.Fatalf("publish with a key file outside --key-dir: %v", err)
	}
	p := n.newPod("signed")
	if err := publish(p, repo+":v1", pub); err != nil {
		t.Fatalf("publish of a signed version: %v", err)
	}
	waitReadable(t, filepath.Join(p.target, "f0.bin"))
	if m := n.fuseMounts(); len(m) != 1 {
		t.Fatalf("mounts: %v", m)
	}
}

// csiPublishRequiring is NodePublishVolume of ref for p with the
// requireSignature attribute, bounded by timeout.
func csiPublishRequiring(n *csiNode, p pod, ref, require string, timeout time.Duration) error {
	req := &csi.NodePublishVolumeRequest{
		VolumeId:   p.volumeID,
		TargetPath: p.target,
		Readonly:   true,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
		VolumeContext: map[string]string{
			"ref": ref, "prefetch": "none", "requireSignature": require,
			"csi.storage.k8s.io/pod.name": p.name, "csi.storage.k8s.io/pod.namespace": "e2e",
			"csi.storage.k8s.io/ephemeral": "true",
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err := n.Node.NodePublishVolume(ctx, req)
	return err
}

// mkfifo makes a FIFO at p, and in t.Cleanup opens it for writing once so
// that a reader stuck opening it (the bug this guards against) goes on.
func mkfifo(t *testing.T, p string) {
	t.Helper()
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unblockFIFO(p) })
}

func unblockFIFO(p string) {
	if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
		f.Close()
	}
}

// TestCSIRequireSignatureFIFO: a requireSignature attribute naming a FIFO
// (in the key directory or anywhere on the node) is refused at once, with
// the message every refused key path gets (a missing file, a file that is
// no key, a path outside --key-dir), and the plugin then stops at SIGTERM.
func TestCSIRequireSignatureFIFO(t *testing.T) {
	keys := t.TempDir()
	_, pub := keyPair(t, keys, "release")
	mkfifo(t, filepath.Join(keys, "fifo.pub"))
	elsewhere := filepath.Join(t.TempDir(), "fifo")
	mkfifo(t, elsewhere)
	reg := newDistribution(t)
	repo := reg.Host + "/vols/fifo"
	pushJSON(t, repo+":v1", smallVolume(t, 41))
	n := startCSI(t, time.Minute)
	// Before the harness stops the plugin: let an open stuck on a FIFO go on.
	t.Cleanup(func() { unblockFIFO(filepath.Join(keys, "fifo.pub")); unblockFIFO(elsewhere) })
	n.restartNodeWith("--key-dir", keys)

	var msg string
	for i, path := range []string{filepath.Join(keys, "fifo.pub"), "fifo.pub", elsewhere, filepath.Join(keys, "missing.pub"),
		"/etc/passwd", "/nonexistent/x.pub", "../" + filepath.Base(filepath.Dir(elsewhere)) + "/fifo"} {
		start := time.Now()
		err := csiPublishRequiring(n, n.newPod(fmt.Sprintf("p%d", i)), repo+":v1", path, 10*time.Second)
		took := time.Since(start)
		if codeOf(err) == codes.DeadlineExceeded {
			t.Fatalf("publish requiring %s: no answer in %v (the plugin hangs opening it)", path, took)
		}
		if codeOf(err) != codes.InvalidArgument || took > 5*time.Second {
			t.Fatalf("publish requiring %s: %v after %v; want InvalidArgument at once", path, err, took)
		}
		_, why, _ := strings.Cut(status.Convert(err).Message(), "requireSignature: ")
		if msg == "" {
			msg = why
		}
		if why != msg || strings.Contains(why, path) {
			t.Errorf("publish requiring %s: refused with %q; want the one message %q", path, why, msg)
		}
	}
	if !strings.Contains(msg, "key directory") {
		t.Errorf("the refusal %q does not say where key files may be", msg)
	}
	if m := n.fuseMounts(); len(m) != 0 {
		t.Fatalf("mounts after the refusals: %v", m)
	}
	// The key beside the FIFO is used.
	p := n.newPod("signed-by-file")
	if err := csiPublishRequiring(n, p, repo+":v1", filepath.Base(pub), time.Minute); codeOf(err) != codes.PermissionDenied ||
		!strings.Contains(err.Error(), "no signature") {
		t.Fatalf("publish of an unsigned version requiring %s: %v; want PermissionDenied, no signature", pub, err)
	}

	// No RPC is stuck: the plugin stops at SIGTERM.
	n.conn.Close()
	n.conn = nil
	n.node.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { n.node.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Errorf("the node plugin did not stop in 10s after SIGTERM")
		unblockFIFO(filepath.Join(keys, "fifo.pub"))
		unblockFIFO(elsewhere)
		n.node.Process.Kill()
		<-done
	}
	n.node = nil
}

// TestKeyFileFIFO: the CLI's key files (verify --key, pull
// --require-signature, sign --key) that are FIFOs are refused at once.
func TestKeyFileFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "key.pub")
	mkfifo(t, fifo)
	reg := newDistribution(t)
	repo := reg.Host + "/vols/fifo"
	pushJSON(t, repo+":v1", smallVolume(t, 42))
	for _, args := range [][]string{
		{"verify", "--key", fifo, repo + ":v1"},
		{"pull", "--require-signature", fifo, repo + ":v1", filepath.Join(t.TempDir(), "out")},
		{"sign", "--key", fifo, repo + ":v1"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd := exec.CommandContext(ctx, bin(t), args...)
		cmd.Env = cliEnv(t, "COSIGN_PASSWORD=e2e-pass")
		start := time.Now()
		out, err := cmd.CombinedOutput()
		took := time.Since(start)
		timedOut := ctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatalf("bdnvol %s: still running after %v (hangs opening the FIFO)", strings.Join(args, " "), took)
		}
		if err == nil || !strings.Contains(string(out), "not a regular file") {
			t.Errorf("bdnvol %s: %v after %v; want a refusal of the FIFO:\n%s", strings.Join(args, " "), err, took, out)
		}
	}
}

// pushHostileReferrers stores n signature referrers of version d in name,
// each of layers entries naming one 64 KiB simple-signing payload (of d),
// with signatures that verify with no key: what a registry a version
// comes from can list.
func pushHostileReferrers(t testing.TB, reg *registry, name, d string, size int64, n, layers int) {
	t.Helper()
	pad := strings.Repeat("x", 64<<10)
	pl := func(pad string) []byte {
		b, _ := json.Marshal(map[string]any{
			"critical": map[string]any{"identity": map[string]string{"docker-reference": name},
				"image": map[string]string{"docker-manifest-digest": d}, "type": "cosign container image signature"},
			"optional": map[string]string{"pad": pad},
		})
		return b
	}
	payload := pl(pad[:64<<10-len(pl(""))])
	pd := uploadBlob(t, reg, name, payload)
	cfg := uploadBlob(t, reg, name, []byte("{}"))
	sig := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x30}, 71))
	type desc struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int64             `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	for i := 0; i < n; i++ {
		ls := make([]desc, layers)
		for j := range ls {
			ls[j] = desc{"application/vnd.dev.cosign.simplesigning.v1+json", pd, int64(len(payload)),
				map[string]string{"dev.cosignproject.cosign/signature": sig, "dev.bdnvol.signature/key": fmt.Sprintf("%064x", i*layers+j)}}
		}
		mb, _ := json.Marshal(map[string]any{
			"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
			"artifactType": "application/vnd.dev.cosign.artifact.sig.v1+json",
			"config":       desc{MediaType: "application/vnd.dev.cosign.artifact.sig.v1+json", Digest: cfg, Size: 2},
			"layers":       ls,
			"subject":      desc{MediaType: "application/vnd.oci.image.manifest.v1+json", Digest: d, Size: size},
		})
		putManifest(t, reg, name, digestOf(mb), "application/vnd.oci.image.manifest.v1+json", mb)
	}
}

// peakRSSOf runs the CLI with args and returns its exit error, and its
// peak RSS in KiB read from its /proc/PID/status (VmHWM) while it runs.
func peakRSSOf(t testing.TB, args ...string) (int64, []byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin(t), args...)
	cmd.Env = cliEnv(t)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	status := fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)
	var peak int64
	for {
		if b, err := os.ReadFile(status); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
					var kib int64
					fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &kib)
					peak = max(peak, kib)
				}
			}
		}
		select {
		case err := <-done:
			return peak, out.Bytes(), err
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// TestVerifyHostileReferrersRSS: a version whose registry lists 48
// signature referrers of 256 entries each, all naming one 64 KiB payload,
// is refused by verify --key in bounded memory, fetching the payload once.
func TestVerifyHostileReferrersRSS(t *testing.T) {
	keys := t.TempDir()
	_, pub := keyPair(t, keys, "release")
	reg := newGGCRReferrers(t)
	name := "models/hostile"
	v := pushJSON(t, reg.Host+"/"+name+":v1", smallVolume(t, 51))
	root := registryManifest(t, reg, name, v.Digest)
	pushHostileReferrers(t, reg, name, v.Digest, int64(len(root)), 48, 256)
	reg.ResetStats()
	kib, out, err := peakRSSOf(t, "verify", "--key", pub, reg.Host+"/"+name+"@"+v.Digest)
	st := reg.Stats()
	t.Logf("verify --key with 48 hostile referrers x 256 entries: peak RSS %.1f MiB, %d blob bytes served, requests %v",
		float64(kib)/1024, st.BlobBytesOut, st.Requests)
	if err == nil || !strings.Contains(string(out), "signed by another key") {
		t.Fatalf("verify: %v; want a refusal, signed by another key:\n%s", err, out)
	}
	if kib == 0 || kib > 128<<10 {
		t.Errorf("verify --key: peak RSS %.1f MiB, want under 128 MiB", float64(kib)/1024)
	}
	if st.BlobBytesOut > 1<<20 {
		t.Errorf("verify --key: %d blob bytes fetched, want the 64 KiB payload once", st.BlobBytesOut)
	}
}

// vmHWMOf is the peak RSS of the running process pid in KiB, from its
// /proc/PID/status.
func vmHWMOf(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kib int64
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &kib)
			return kib
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// TestCSIRequireSignatureHostileReferrersRSS: a pod requiring a signature
// of a version whose registry lists 48 hostile signature referrers (256
// entries each naming one 64 KiB payload) is refused by the node plugin in
// bounded memory.
func TestCSIRequireSignatureHostileReferrersRSS(t *testing.T) {
	keys := t.TempDir()
	_, pub := keyPair(t, keys, "release")
	reg := newGGCRReferrers(t)
	name := "vols/hostile"
	v := pushJSON(t, reg.Host+"/"+name+":v1", smallVolume(t, 52))
	pushHostileReferrers(t, reg, name, v.Digest, int64(len(registryManifest(t, reg, name, v.Digest))), 48, 256)
	n := startCSI(t, time.Minute)
	before := vmHWMOf(t, n.node.Process.Pid)
	reg.ResetStats()
	err := csiPublishRequiring(n, n.newPod("hostile"), reg.Host+"/"+name+":v1", string(mustRead(t, pub)), 2*time.Minute)
	peak := vmHWMOf(t, n.node.Process.Pid)
	st := reg.Stats()
	t.Logf("node plugin publish requiring a signature, 48 hostile referrers x 256 entries: peak RSS %.1f MiB (%.1f MiB before), %d blob bytes served",
		float64(peak)/1024, float64(before)/1024, st.BlobBytesOut)
	if codeOf(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "signed by another key") {
		t.Fatalf("publish: %v; want PermissionDenied, signed by another key", err)
	}
	if peak > 128<<10 {
		t.Errorf("node plugin: peak RSS %.1f MiB after the publish, want under 128 MiB", float64(peak)/1024)
	}
	if st.BlobBytesOut > 1<<20 {
		t.Errorf("node plugin: %d blob bytes fetched, want the 64 KiB payload once", st.BlobBytesOut)
	}
}

// TestGCDeletesSignatures: rm keeps a deleted version's signature (restore
// brings it back signed); gc --purge deletes it with the version and keeps
// the kept versions' signatures: the signature tag on distribution, the
// tag's manifest and the OCI 1.1 referrer on a registry serving referrers.
func TestGCDeletesSignatures(t *testing.T) {
	keys := t.TempDir()
	key, pub := keyPair(t, keys, "release")
	for _, kind := range []string{"distribution", "ggcr-referrers"} {
		t.Run(kind, func(t *testing.T) {
			api := kind == "ggcr-referrers"
			reg := newDistribution(t)
			if api {
				reg = newGGCRReferrers(t)
			}
			name := "models/gcsig"
			repo := reg.Host + "/" + name
			var ds []string
			for i := 0; i < 3; i++ {
				d := pushJSON(t, fmt.Sprintf("%s:v%d", repo, i), smallVolume(t, 30+i)).Digest
				if res := signRun(t, "sign", "--key", key, repo+"@"+d); res.code != 0 {
					t.Fatalf("sign:\n%s", res)
				}
				ds = append(ds, d)
			}
			mustRun(t, "rm", repo+"@"+ds[0])
			if res := run(t, "verify", "--key", pub, repo+"@"+ds[0]); res.code != 0 {
				t.Fatalf("a soft-deleted version lost its signature:\n%s", res)
			}
			check := func(when string, want []bool) {
				t.Helper()
				tags := listTags(t, reg, name)
				for i, d := range ds {
					if api {
						// go-containerregistry's registry keeps a tag whose
						// manifest is deleted by digest: check the manifests.
						sig := manifestStatus(t, reg, name, sigTag(d)) == http.StatusOK &&
							manifestStatus(t, reg, name, digestOfTag(t, reg, name, sigTag(d))) == http.StatusOK
						refs := sigReferrers(t, reg, name, d)
						if sig != want[i] || (len(refs) == 1) != want[i] || len(refs) > 1 {
							t.Errorf("%s: version %d (%s): tag-scheme signature %v, signature referrers %v; want present %v", when, i, d, sig, refs, want[i])
						}
						continue
					}
					has := false
					for _, tag := range tags {
						has = has || tag == sigTag(d)
					}
					if has != want[i] {
						t.Errorf("%s: version %d (%s): signature tag present %v, want %v; tags %v", when, i, d, has, want[i], tags)
					}
				}
			}
			check("after signing", []bool{true, true, true})
			// The first run purges v0 (deleted by rm) and soft-deletes v1.
			gc := []string{"gc", repo, "--keep-last", "1", "--keep-tag", "none", "--purge", "--restore-window", "0s", "--apply"}
			mustRun(t, gc...)
			check("after the first gc", []bool{false, true, true})
			mustRun(t, gc...)
			check("after the second gc", []bool{false, false, true})
			if res := run(t, "verify", "--key", pub, repo+"@"+ds[2]); res.code != 0 {
				t.Fatalf("the kept version's signature:\n%s", res)
			}
		})
	}
}

// digestOfTag is the digest a registry answers for name:tag ("" if none).
func digestOfTag(t testing.TB, reg *registry, name, tag string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodHead, reg.URL+"/v2/"+name+"/manifests/"+tag, nil)
	req.Header.Set("Accept", manifestAccepts)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.Header.Get("Docker-Content-Digest")
}
