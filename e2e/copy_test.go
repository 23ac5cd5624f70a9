package e2e

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// copyResult is what `bdnvol copy --json` prints.
type copyResult struct {
	Reference         string   `json:"reference"`
	Digest            string   `json:"digest"`
	Tags              []string `json:"tags"`
	Blobs             int      `json:"blobs"`
	BlobsSent         int      `json:"blobs_sent"`
	BlobsSkipped      int      `json:"blobs_skipped"`
	BlobsMounted      int      `json:"blobs_mounted"`
	Bytes             int64    `json:"bytes"`
	BytesSent         int64    `json:"bytes_sent"`
	BytesSkipped      int64    `json:"bytes_skipped"`
	BytesMounted      int64    `json:"bytes_mounted"`
	ManifestsSent     int      `json:"manifests_sent"`
	ManifestBytesSent int64    `json:"manifest_bytes_sent"`
}

// copyJSON runs `bdnvol copy --json` and decodes its report.
func copyJSON(t testing.TB, args ...string) copyResult {
	t.Helper()
	res := mustRun(t, append([]string{"copy", "--json"}, args...)...)
	var r copyResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.stdout)), &r); err != nil {
		t.Fatalf("copy --json: %v\n%s", err, res)
	}
	return r
}

// blobPresent reports whether the registry's repository name holds blob d.
func blobPresent(t testing.TB, reg *registry, name, d string) bool {
	t.Helper()
	resp, err := http.Head(reg.URL + "/v2/" + name + "/blobs/" + d)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// sumBlobs adds the sizes of the blobs of a that b lacks (b may be nil).
func sumBlobs(a, b map[string]int64) int64 {
	var n int64
	for d, s := range a {
		if _, ok := b[d]; !ok {
			n += s
		}
	}
	return n
}

// fineTunePair writes a synthetic checkpoint and a fine-tune of it that
// changes 30% of its tensor bytes, and returns their directories.
func fineTunePair(t *testing.T, size int64) (string, string) {
	t.Helper()
	base := t.TempDir()
	v1, v2 := filepath.Join(base, "v1"), filepath.Join(base, "v2")
	if err := synth.Generate(v1, synth.Options{TargetBytes: size, Shards: 3, Seed: 1, Layers: 2, Hidden: 768, Intermediate: 1024}); err != nil {
		t.Fatal(err)
	}
	if _, err := synth.FineTune(v1, v2, synth.FineTuneOptions{Fraction: 0.30, Seed: 2}); err != nil {
		t.Fatal(err)
	}
	return v1, v2
}

// TestCopyRegistryToRegistry copies v1 into an empty registry (every blob
// sent), then a fine-tune v2 into the registry holding v1: exactly the
// blobs v2 has and v1 lacks are sent, the digests are the source's, the
// protective tags come along, and a pull of the copy is the source tree.
func TestCopyRegistryToRegistry(t *testing.T) {
	bin(t)
	v1, v2 := fineTunePair(t, 24<<20)
	src := newDistribution(t)
	d1 := pushJSON(t, src.Host+"/model:v1", v1).Digest
	d2 := pushJSON(t, src.Host+"/model:v2", v2).Digest
	b1, b2 := versionBlobs(t, src, "model", d1), versionBlobs(t, src, "model", d2)

	forKinds(t, []string{"distribution", "ggcr"}, func(t *testing.T, tg target) {
		dst := tg.reg
		dst.ResetStats()
		r1 := copyJSON(t, src.Host+"/model:v1", dst.Host+"/mirror/model")
		in := dst.Stats().BlobBytesIn
		total := sumBlobs(b1, nil)
		t.Logf("v1 into an empty registry: sent %d bytes (registry received %d), ideal %d (all %d blobs)", r1.BytesSent, in, total, len(b1))
		if r1.Digest != d1 || tagDigest(t, dst, "mirror/model", "v1") != d1 {
			t.Errorf("copy of v1: digest %s, tag v1 -> %s; want %s", r1.Digest, tagDigest(t, dst, "mirror/model", "v1"), d1)
		}
		if r1.BytesSent != total || in != total || r1.BlobsSent != len(b1) || r1.BytesSkipped != 0 {
			t.Errorf("copy of v1: sent %d bytes in %d blobs (registry got %d), skipped %d; want all %d bytes in %d blobs", r1.BytesSent, r1.BlobsSent, in, r1.BytesSkipped, total, len(b1))
		}
		sealed := 0
		for _, tag := range listTags(t, dst, "mirror/model") {
			if strings.HasPrefix(tag, "sealed-") && strings.HasSuffix(tag, strings.TrimPrefix(d1, "sha256:")[:12]) {
				sealed++
			}
		}
		if sealed != 1 {
			t.Errorf("copy of v1: %d protective tags of v1 at the destination, want 1: %v", sealed, listTags(t, dst, "mirror/model"))
		}

		dst.ResetStats()
		r2 := copyJSON(t, src.Host+"/model:v2", dst.Host+"/mirror/model")
		in = dst.Stats().BlobBytesIn
		ideal := sumBlobs(b2, b1)
		t.Logf("v2 into the registry holding v1: sent %d bytes (registry received %d), ideal %d of %d; skipped %d", r2.BytesSent, in, ideal, sumBlobs(b2, nil), r2.BytesSkipped)
		if r2.Digest != d2 || tagDigest(t, dst, "mirror/model", "v2") != d2 {
			t.Errorf("copy of v2: digest %s, want %s", r2.Digest, d2)
		}
		if r2.BytesSent != ideal || in != ideal || r2.BytesSkipped != sumBlobs(b2, nil)-ideal {
			t.Errorf("copy of v2: sent %d (registry got %d), skipped %d; want sent %d, skipped %d", r2.BytesSent, in, r2.BytesSkipped, ideal, sumBlobs(b2, nil)-ideal)
		}
		out := filepath.Join(t.TempDir(), "out")
		pull(t, dst.Host+"/mirror/model:v2", out)
		compareTrees(t, v2, out)
		mustRun(t, "verify", dst.Host+"/mirror/model:v2", out)

		// Nothing is missing now: a re-run sends nothing.
		dst.ResetStats()
		r3 := copyJSON(t, src.Host+"/model:v2", dst.Host+"/mirror/model")
		if in := dst.Stats().BlobBytesIn; r3.BytesSent != 0 || in != 0 || r3.ManifestsSent != 0 {
			t.Errorf("repeated copy: sent %d bytes (registry got %d) and %d manifests, want none", r3.BytesSent, in, r3.ManifestsSent)
		}
	})
}

// TestCopyMountsWithinARegistry copies between two repositories of one
// registry by mounting: no blob byte is uploaded.
func TestCopyMountsWithinARegistry(t *testing.T) {
	bin(t)
	v1, _ := fineTunePair(t, 8<<20)
	reg := newDistribution(t)
	d := pushJSON(t, reg.Host+"/staging/model:v1", v1).Digest
	reg.ResetStats()
	r := copyJSON(t, reg.Host+"/staging/model:v1", reg.Host+"/prod/model:v1")
	st := reg.Stats()
	t.Logf("mount: %d of %d blobs mounted, %d bytes sent, registry received %d blob bytes", r.BlobsMounted, r.Blobs, r.BytesSent, st.BlobBytesIn)
	if r.Digest != d || r.BlobsMounted != r.Blobs || r.BytesSent != 0 || st.BlobBytesIn != 0 {
		t.Errorf("copy within a registry: %+v, registry received %d blob bytes; want every blob mounted, none sent", r, st.BlobBytesIn)
	}
	out := filepath.Join(t.TempDir(), "out")
	pull(t, reg.Host+"/prod/model:v1", out)
	compareTrees(t, v1, out)
}

// TestCopyKilledResumes kills a copy with SIGKILL once some bytes have
// arrived; the re-run sends exactly the blobs the destination still lacks.
func TestCopyKilledResumes(t *testing.T) {
	bin(t)
	v1, _ := fineTunePair(t, 96<<20)
	src := newDistribution(t)
	d := pushJSON(t, src.Host+"/model:v1", v1).Digest
	blobs := versionBlobs(t, src, "model", d)
	total := sumBlobs(blobs, nil)
	dst := newDistribution(t)

	cmd := exec.Command(bin(t), "copy", "--jobs", "1", src.Host+"/model:v1", dst.Host+"/model")
	cmd.Env = cliEnv(t)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	killed := false
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("copy ended before the kill (%v):\n%s", err, out.String())
		default:
		}
		if dst.Stats().BlobBytesIn >= total/3 {
			cmd.Process.Signal(syscall.SIGKILL)
			<-done
			killed = true
			break
		}
	}
	if !killed {
		t.Fatal("no bytes arrived within a minute")
	}
	dst.Settle(t)
	if tag := tagDigest(t, dst, "model", "v1"); tag != "" {
		t.Fatalf("the killed copy left tag v1 -> %s", tag)
	}
	missing := map[string]int64{}
	for b, size := range blobs {
		if !blobPresent(t, dst, "model", b) {
			missing[b] = size
		}
	}
	want := sumBlobs(missing, nil)
	before := dst.Stats().BlobBytesIn
	dst.ResetStats()
	r := copyJSON(t, src.Host+"/model:v1", dst.Host+"/model")
	in := dst.Stats().BlobBytesIn
	t.Logf("killed after %d of %d blob bytes had arrived (%d of %d blobs whole); re-run sent %d bytes (registry received %d), ideal %d", before, total, len(blobs)-len(missing), len(blobs), r.BytesSent, in, want)
	if r.Digest != d || r.BytesSent != want || in != want || r.BlobsSent != len(missing) {
		t.Errorf("re-run after the kill: %+v, registry received %d; want %d bytes in %d blobs", r, in, want, len(missing))
	}
	if want == 0 || want == total {
		t.Errorf("the kill came at an edge (%d of %d bytes missing): the test proved nothing", want, total)
	}
	dir := filepath.Join(t.TempDir(), "out")
	pull(t, dst.Host+"/model:v1", dir)
	compareTrees(t, v1, dir)
}

// TestCopyCorruptSource copies from a registry that serves one chunk with a
// flipped byte: the copy fails with a digest error, the destination never
// holds that blob, and no tag points at the version.
func TestCopyCorruptSource(t *testing.T) {
	bin(t)
	v1, _ := fineTunePair(t, 8<<20)
	src := newDistribution(t)
	d := pushJSON(t, src.Host+"/model:v1", v1).Digest
	var bad string
	var size int64
	for b, s := range versionBlobs(t, src, "model", d) {
		if s > size {
			bad, size = b, s
		}
	}
	src.Corrupt(bad)
	forKinds(t, []string{"distribution", "ggcr", "oci-layout"}, func(t *testing.T, tg target) {
		res := run(t, "copy", src.Host+"/model:v1", tg.repo("model"))
		if res.code == 0 || !strings.Contains(res.stderr, "does not match its digest") || !strings.Contains(res.stderr, bad) {
			t.Fatalf("copy from a corrupting source: want a digest error naming %s:\n%s", bad, res)
		}
		if tg.reg != nil {
			if blobPresent(t, tg.reg, "model", bad) {
				t.Errorf("the destination holds the corrupted blob %s", bad)
			}
			if tag := tagDigest(t, tg.reg, "model", "v1"); tag != "" {
				t.Errorf("tag v1 -> %s after a failed copy", tag)
			}
			return
		}
		p := filepath.Join(tg.root, "model", "blobs", "sha256", strings.TrimPrefix(bad, "sha256:"))
		if res := run(t, "resolve", tg.repo("model")+":v1"); res.code == 0 {
			t.Errorf("tag v1 resolves after a failed copy:\n%s", res)
		}
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("the layout holds the corrupted blob %s", p)
		}
	})
}

// TestCopyLayoutRoundTrip copies registry -> OCI layout -> another
// registry: digests preserved, the second leg sends every blob once, and
// the final copy pulls bit-identical; a layout -> layout copy too.
func TestCopyLayoutRoundTrip(t *testing.T) {
	bin(t)
	v1, v2 := fineTunePair(t, 16<<20)
	src := newDistribution(t)
	d1 := pushJSON(t, src.Host+"/model:v1", v1).Digest
	d2 := pushJSON(t, src.Host+"/model:v2", v2).Digest
	b1, b2 := versionBlobs(t, src, "model", d1), versionBlobs(t, src, "model", d2)
	lay := "oci:" + filepath.Join(t.TempDir(), "layout")

	r1 := copyJSON(t, src.Host+"/model:v1", lay)
	r2 := copyJSON(t, src.Host+"/model:v2", lay)
	t.Logf("registry -> layout: v1 wrote %d bytes (ideal %d), v2 wrote %d (ideal %d)", r1.BytesSent, sumBlobs(b1, nil), r2.BytesSent, sumBlobs(b2, b1))
	if r1.Digest != d1 || r2.Digest != d2 || r1.BytesSent != sumBlobs(b1, nil) || r2.BytesSent != sumBlobs(b2, b1) {
		t.Errorf("into the layout: %+v / %+v; want digests %s %s and bytes %d %d", r1, r2, d1, d2, sumBlobs(b1, nil), sumBlobs(b2, b1))
	}
	if got := strings.TrimSpace(mustRun(t, "resolve", lay+":v2").stdout); !strings.HasSuffix(got, "@"+d2) {
		t.Errorf("layout tag v2 resolves to %s, want %s", got, d2)
	}

	dst := newGGCR(t)
	r3 := copyJSON(t, lay+":v1", dst.Host+"/model")
	r4 := copyJSON(t, lay+":v2", dst.Host+"/model")
	t.Logf("layout -> registry: v1 sent %d bytes (ideal %d), v2 sent %d (ideal %d)", r3.BytesSent, sumBlobs(b1, nil), r4.BytesSent, sumBlobs(b2, b1))
	if r3.Digest != d1 || r4.Digest != d2 || r3.BytesSent != sumBlobs(b1, nil) || r4.BytesSent != sumBlobs(b2, b1) {
		t.Errorf("out of the layout: %+v / %+v", r3, r4)
	}
	out := filepath.Join(t.TempDir(), "out")
	pull(t, dst.Host+"/model:v2", out)
	compareTrees(t, v2, out)

	lay2 := "oci:" + filepath.Join(t.TempDir(), "layout2")
	r5 := copyJSON(t, lay+":v2", lay2+":prod")
	if r5.Digest != d2 || r5.BytesSent != sumBlobs(b2, nil) {
		t.Errorf("layout -> layout: %+v", r5)
	}
	out2 := filepath.Join(t.TempDir(), "out2")
	pull(t, lay2+":prod", out2)
	compareTrees(t, v2, out2)
}

// TestCopyThroughFaults copies through fault proxies: the source cuts the
// first GET of every blob half-way and answers every 7th request 503, the
// destination refuses upload bodies over 1 MiB (413) and answers every 5th
// request 503. The copy completes, sends every blob once, and the copy pulls
// bit-identical.
func TestCopyThroughFaults(t *testing.T) {
	bin(t)
	v1, _ := fineTunePair(t, 8<<20)
	src, dst := newDistribution(t), newDistribution(t)
	d := pushJSON(t, src.Host+"/model:v1", v1).Digest
	sp, dp := newFaultProxy(t, src), newFaultProxy(t, dst)
	sp.Set(faultConfig{CutFirstBlobGET: true, Fail503Every: 7})
	dp.Set(faultConfig{MaxBody: 1 << 20, Fail503Every: 5})
	blobs := versionBlobs(t, src, "model", d)
	r := copyJSON(t, sp.Host+"/model:v1", dp.Host+"/model")
	t.Logf("through faults: source injected %v, destination injected %v; sent %d bytes in %d blobs (ideal %d in %d)", sp.Injected(), dp.Injected(), r.BytesSent, r.BlobsSent, sumBlobs(blobs, nil), len(blobs))
	if r.Digest != d || r.BytesSent != sumBlobs(blobs, nil) {
		t.Errorf("copy through faults: %+v", r)
	}
	if sp.Injected()["cut"] == 0 || dp.Injected()["413"] == 0 || dp.Injected()["503"] == 0 {
		t.Errorf("faults not exercised: source %v, destination %v", sp.Injected(), dp.Injected())
	}
	out := filepath.Join(t.TempDir(), "out")
	pull(t, dst.Host+"/model:v1", out)
	compareTrees(t, v1, out)
}

// TestCopyIndexOfParts copies a version stored as an image index of part
// manifests: the digest of the root and of every part is the source's.
func TestCopyIndexOfParts(t *testing.T) {
	bin(t)
	v1, v2 := fineTunePair(t, 4<<20)
	src, dst := newDistribution(t), newGGCR(t)
	flags := []string{"--chunk-min", "16KiB", "--chunk-avg", "32KiB", "--chunk-max", "64KiB", "--max-layers", "40"}
	d1 := pushJSON(t, src.Host+"/model:v1", v1, flags...).Digest
	d2 := pushJSON(t, src.Host+"/model:v2", v2, flags...).Digest
	raw, _ := getManifest(t, src, "model", d2, manifestAccepts)
	var idx ociManifest
	mustJSON(t, raw, &idx)
	if len(idx.Manifests) < 2 {
		t.Fatalf("v2 is not an index of parts: %s", raw)
	}
	b1, b2 := versionBlobs(t, src, "model", d1), versionBlobs(t, src, "model", d2)
	copyJSON(t, src.Host+"/model:v1", dst.Host+"/model")
	r := copyJSON(t, src.Host+"/model:v2", dst.Host+"/model")
	t.Logf("index of %d parts: v2 after v1 sent %d bytes, ideal %d; %d manifests sent", len(idx.Manifests), r.BytesSent, sumBlobs(b2, b1), r.ManifestsSent)
	if r.Digest != d2 || r.BytesSent != sumBlobs(b2, b1) {
		t.Errorf("copy of an index of parts: %+v", r)
	}
	for _, p := range idx.Manifests {
		if got, _ := getManifest(t, dst, "model", p.Digest, manifestAccepts); digestOf(got) != p.Digest {
			t.Errorf("part %s: the destination serves %s", p.Digest, digestOf(got))
		}
	}
	out := filepath.Join(t.TempDir(), "out")
	pull(t, dst.Host+"/model:v2", out)
	compareTrees(t, v2, out)
}

// TestCopyAllTags copies a whole repository: every tag (protective, human,
// history) points at the source's digest, and `versions` lists the same
// versions at the destination.
func TestCopyAllTags(t *testing.T) {
	bin(t)
	v1, v2 := fineTunePair(t, 4<<20)
	src := newDistribution(t)
	pushJSON(t, src.Host+"/model:v1", v1)
	pushJSON(t, src.Host+"/model:v2", v2, "--tag", "prod")
	mustRun(t, "tag", src.Host+"/model:v1", "prod") // a rollback, with tag history
	forKinds(t, []string{"distribution", "oci-layout"}, func(t *testing.T, tg target) {
		dstRepo := tg.repo("mirror")
		r := copyJSON(t, "--all-tags", src.Host+"/model", dstRepo)
		tags := listTags(t, src, "model")
		t.Logf("--all-tags: %d tags, %d blobs, sent %d bytes, %d manifests", len(tags), r.Blobs, r.BytesSent, r.ManifestsSent)
		for _, tag := range tags {
			want := tagDigest(t, src, "model", tag)
			got := layoutOrRegistryTag(t, tg, "mirror", tag)
			if got != want {
				t.Errorf("tag %s: destination resolves to %s, source to %s", tag, got, want)
			}
		}
		if len(r.Tags) != len(tags) {
			t.Errorf("copied %d tags, the source has %d", len(r.Tags), len(tags))
		}
		vs := func(repo string) string {
			out := mustRun(t, "versions", "--json", repo).stdout
			return strings.ReplaceAll(out, repo, "REPO")
		}
		if a, b := vs(src.Host+"/model"), vs(dstRepo); a != b {
			t.Errorf("versions differ:\nsource %s\ncopy   %s", a, b)
		}
		hist := func(repo string) string {
			out := mustRun(t, "history", "--json", repo+":prod").stdout
			return strings.ReplaceAll(out, repo, "REPO")
		}
		if a, b := hist(src.Host+"/model"), hist(dstRepo); a != b {
			t.Errorf("history of prod differs:\nsource %s\ncopy   %s", a, b)
		}
	})
}

// TestCopyReferrers copies a version with its image view (a referrer whose
// subject is the version) into a registry serving the referrers API.
func TestCopyReferrers(t *testing.T) {
	bin(t)
	v1, _ := fineTunePair(t, 4<<20)
	src := newGGCRReferrers(t)
	d := pushJSON(t, src.Host+"/model:v1", v1).Digest
	mustRun(t, "export-image", src.Host+"/model:v1")
	dst := newGGCRReferrers(t)
	r := copyJSON(t, src.Host+"/model:v1", dst.Host+"/model")
	if r.Digest != d {
		t.Fatalf("copy: %+v", r)
	}
	refs := func(reg *registry) string {
		resp, err := http.Get(reg.URL + "/v2/model/referrers/" + d)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var idx ociManifest
		if err := json.NewDecoder(resp.Body).Decode(&idx); err != nil {
			t.Fatal(err)
		}
		var ds []string
		for _, m := range idx.Manifests {
			ds = append(ds, m.Digest)
		}
		return strings.Join(ds, ",")
	}
	a, b := refs(src), refs(dst)
	t.Logf("referrers: source %s, copy %s; %d manifests sent", a, b, r.ManifestsSent)
	if a == "" || a != b {
		t.Errorf("referrers of the copy %q, of the source %q", b, a)
	}
	if res := run(t, "copy", "--no-referrers", src.Host+"/model:v1", dst.Host+"/bare"); res.code != 0 {
		t.Fatalf("copy --no-referrers:\n%s", res)
	}
	resp, err := http.Get(dst.URL + "/v2/bare/referrers/" + d)
	if err != nil {
		t.Fatal(err)
	}
	var idx ociManifest
	json.NewDecoder(resp.Body).Decode(&idx)
	resp.Body.Close()
	if len(idx.Manifests) != 0 {
		t.Errorf("copy --no-referrers copied %d referrers", len(idx.Manifests))
	}
}

// layoutOrRegistryTag returns the digest tag points at in the repository
// name of tg, or "".
func layoutOrRegistryTag(t testing.TB, tg target, name, tag string) string {
	t.Helper()
	if tg.reg != nil {
		return tagDigest(t, tg.reg, name, tag)
	}
	b, err := os.ReadFile(filepath.Join(tg.root, name, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var idx struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	mustJSON(t, b, &idx)
	for _, m := range idx.Manifests {
		if m.Annotations["org.opencontainers.image.ref.name"] == tag {
			return m.Digest
		}
	}
	return ""
}

// TestCopySignature copies a signed version: the cosign signature tag comes
// along, and `verify --key` passes on the copy.
func TestCopySignature(t *testing.T) {
	bin(t)
	key, pub := keyPair(t, t.TempDir(), "k")
	src := newDistribution(t)
	d := pushJSON(t, src.Host+"/model:v1", smallVolume(t, 1)).Digest
	if res := signRun(t, "sign", "--key", key, src.Host+"/model:v1"); res.code != 0 {
		t.Fatalf("sign:\n%s", res)
	}
	forKinds(t, []string{"distribution", "ggcr-referrers"}, func(t *testing.T, tg target) {
		r := copyJSON(t, src.Host+"/model@"+d, tg.repo("model")+":v1")
		t.Logf("signed copy: tags %v", r.Tags)
		if tagDigest(t, tg.reg, "model", sigTag(d)) == "" {
			t.Errorf("the copy has no %s tag: %v", sigTag(d), listTags(t, tg.reg, "model"))
		}
		mustRun(t, "verify", "--key", pub, tg.repo("model")+":v1")
	})
}

// TestCopyListOfVersions copies two versions in one command: each keeps
// its tag, and the blobs they share are sent once.
func TestCopyListOfVersions(t *testing.T) {
	bin(t)
	v1, v2 := fineTunePair(t, 4<<20)
	src, dst := newDistribution(t), newGGCR(t)
	d1 := pushJSON(t, src.Host+"/model:v1", v1).Digest
	d2 := pushJSON(t, src.Host+"/model:v2", v2).Digest
	b1, b2 := versionBlobs(t, src, "model", d1), versionBlobs(t, src, "model", d2)
	union := map[string]int64{}
	for _, m := range []map[string]int64{b1, b2} {
		for d, s := range m {
			union[d] = s
		}
	}
	r := copyJSON(t, src.Host+"/model:v1", src.Host+"/model:v2", dst.Host+"/model")
	in := dst.Stats().BlobBytesIn
	t.Logf("v1 and v2 in one copy: sent %d bytes (registry received %d), ideal %d", r.BytesSent, in, sumBlobs(union, nil))
	if r.BytesSent != sumBlobs(union, nil) || in != r.BytesSent {
		t.Errorf("copy of two versions: %+v, registry received %d; want %d", r, in, sumBlobs(union, nil))
	}
	if tagDigest(t, dst, "model", "v1") != d1 || tagDigest(t, dst, "model", "v2") != d2 {
		t.Errorf("tags at the copy: v1 -> %s, v2 -> %s", tagDigest(t, dst, "model", "v1"), tagDigest(t, dst, "model", "v2"))
	}
	if r := copyJSON(t, "--tag", "prod", "--tag", "stable", src.Host+"/model:v2", dst.Host+"/model"); r.ManifestsSent != 0 ||
		tagDigest(t, dst, "model", "prod") != d2 || tagDigest(t, dst, "model", "stable") != d2 || tagDigest(t, dst, "model", "v2") != d2 {
		t.Errorf("copy --tag: %+v; tags prod, stable, v2 -> %s, %s, %s", r, tagDigest(t, dst, "model", "prod"), tagDigest(t, dst, "model", "stable"), tagDigest(t, dst, "model", "v2"))
	}
	if res := run(t, "copy", src.Host+"/model:v1", src.Host+"/model:v2", dst.Host+"/model:x"); res.code != 2 {
		t.Errorf("two sources and a destination tag: want a usage error:\n%s", res)
	}
}

// TestCopyAuthTLS copies from a registry that wants bearer tokens to one
// that wants basic auth, both over TLS with their own CAs (one by
// --ca-file, one by SSL_CERT_FILE), with the credentials `login` saved; and
// within the token registry, where the blobs are mounted.
func TestCopyAuthTLS(t *testing.T) {
	bin(t)
	ip := net.IPv4(127, 0, 0, 1)
	const user = "e2e-user"
	pass := "pw-" + hex.EncodeToString(randBytes(uint64(time.Now().UnixNano()), 12))
	src := newAuthRegistry(t, ip, "token", user, pass)
	dst := newAuthRegistry(t, ip, "htpasswd", user, pass)
	var seen []result
	runWith := func(t testing.TB, stdin string, env []string, args ...string) result {
		t.Helper()
		res := runWith(t, stdin, env, args...)
		seen = append(seen, res)
		return res
	}
	for _, r := range []*authRegistry{src, dst} {
		if res := runWith(t, pass+"\n", nil, "login", "--tls", "--ca-file", r.CA.File, r.Host, "-u", user, "--password-stdin"); res.code != 0 {
			t.Fatalf("login:\n%s", res)
		}
	}
	v1 := filepath.Join(t.TempDir(), "src")
	buildTree(t, v1, richTree(), time.Time{})
	res := runWith(t, "", nil, append(append([]string{"push", "--json", "--tls", "--ca-file", src.CA.File}, smallChunks...), src.Host+"/vols/a:v1", v1)...)
	if res.code != 0 {
		t.Fatalf("push:\n%s", res)
	}
	var pr pushResult
	mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &pr)

	res = runWith(t, "", []string{"SSL_CERT_FILE=" + dst.CA.File}, "copy", "--json", "--tls", "--ca-file", src.CA.File, src.Host+"/vols/a:v1", dst.Host+"/vols/b")
	if res.code != 0 {
		t.Fatalf("copy across registries with auth:\n%s", res)
	}
	var r copyResult
	mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &r)
	if r.Digest != pr.Digest || r.BlobsSent != r.Blobs {
		t.Errorf("copy across registries with auth: %+v, want %s with every blob sent", r, pr.Digest)
	}
	out := filepath.Join(t.TempDir(), "out")
	if res := runWith(t, "", nil, "pull", "--tls", "--ca-file", dst.CA.File, dst.Host+"/vols/b:v1", out); res.code != 0 {
		t.Fatalf("pull of the copy:\n%s", res)
	}
	compareTrees(t, v1, out)

	res = runWith(t, "", nil, "copy", "--json", "--tls", "--ca-file", src.CA.File, src.Host+"/vols/a:v1", src.Host+"/vols/c")
	if res.code != 0 {
		t.Fatalf("copy within the token registry:\n%s", res)
	}
	mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &r)
	if r.Digest != pr.Digest || r.BlobsMounted != r.Blobs {
		t.Errorf("copy within the token registry: %+v, want every blob mounted", r)
	}
	checkNoSecrets(t, src, user, pass, seen, []string{home(t)})
}

// TestCopyMakesOneProtectiveTag copies a volume whose source gives it no
// protective tag (an OCI layout whose sealed- tag was removed): the copy
// gets one, and a second copy does not add another.
func TestCopyMakesOneProtectiveTag(t *testing.T) {
	bin(t)
	dir := filepath.Join(t.TempDir(), "layout")
	d := pushJSON(t, "oci:"+dir+":v1", smallVolume(t, 3)).Digest
	p := filepath.Join(dir, "index.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var idx map[string]any
	mustJSON(t, b, &idx)
	var kept []any
	for _, m := range idx["manifests"].([]any) {
		ann, _ := m.(map[string]any)["annotations"].(map[string]any)
		if name, _ := ann["org.opencontainers.image.ref.name"].(string); !strings.HasPrefix(name, "sealed-") {
			kept = append(kept, m)
		}
	}
	idx["manifests"] = kept
	b, _ = json.Marshal(idx)
	mustWrite(t, p, b)

	dst := newDistribution(t)
	sealed := func() []string {
		var s []string
		for _, tag := range listTags(t, dst, "model") {
			if strings.HasPrefix(tag, "sealed-") {
				s = append(s, tag)
			}
		}
		return s
	}
	for i := range 2 {
		if r := copyJSON(t, "oci:"+dir+":v1", dst.Host+"/model"); r.Digest != d {
			t.Fatalf("copy %d: %+v", i, r)
		}
		if s := sealed(); len(s) != 1 || tagDigest(t, dst, "model", s[0]) != d {
			t.Fatalf("after copy %d: protective tags %v, want one at %s", i+1, s, d)
		}
	}
}
