package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// enginestub builds the engine stand-in (cmd/enginestub) once per test.
func enginestub(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "enginestub")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/enginestub")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build enginestub: %v\n%s", err, b)
	}
	return out
}

type stubStart struct {
	Mode    string  `json:"mode"`
	Hash    string  `json:"hash"`
	Key     string  `json:"key"`
	Files   int     `json:"files"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

func runStub(t *testing.T, stub, cacheRoot string, args ...string) stubStart {
	t.Helper()
	cmd := exec.Command(stub, append([]string{"-cache-root", cacheRoot, "-compile-time", "1s"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("enginestub: %v\n%s", err, errb.String())
	}
	var s stubStart
	mustJSON(t, bytes.TrimSpace(out.Bytes()), &s)
	return s
}

// stubKey is the warm-state key the stand-in would start with.
func stubKey(t *testing.T, stub string, args ...string) string {
	t.Helper()
	out, err := exec.Command(stub, append([]string{"-print-key"}, args...)...).Output()
	if err != nil {
		t.Fatalf("enginestub -print-key: %v", err)
	}
	return strings.TrimSpace(string(out))
}

type companionOut struct {
	Digest string `json:"digest"`
	Tree   string `json:"tree"`
	Key    string `json:"key"`
	Error  string `json:"error"`
}

func warmLs(t *testing.T, ref string) []companionOut {
	t.Helper()
	res := mustRun(t, "warmstate", "ls", "--json", ref)
	var cs []companionOut
	mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &cs)
	return cs
}

// TestWarmState runs the engine stand-in against distribution (which
// answers 404 to the referrers API: companions are listed through the tag
// schema): the first start compiles and publishes its cache; a second
// replica pulls the companion of its key and starts without compiling; a
// key that differs in one field gets nothing; two publishers of one key at
// once leave one companion; a signed companion whose key is changed in a
// copy is refused under --require-signature; purging the version deletes
// its companions.
func TestWarmState(t *testing.T) {
	stub := enginestub(t)
	reg := newDistribution(t)
	repo := reg.Host + "/models/warm"
	v := pushJSON(t, repo+":v1", smallVolume(t, 1))
	pinned := repo + "@" + v.Digest

	// Replica 1 compiles and publishes what it compiled.
	root1 := t.TempDir()
	first := runStub(t, stub, root1, "-tp", "2", "-rank", "0")
	if first.Mode != "compiled" {
		t.Fatalf("first start: %+v", first)
	}
	res := mustRun(t, "warmstate", "push", "--json", "--key", first.Key, pinned, root1)
	var pushed struct {
		Companion     companionOut `json:"companion"`
		Existed       bool         `json:"existed"`
		BytesUploaded int64        `json:"bytes_uploaded"`
	}
	mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &pushed)
	if pushed.Existed || !sameKey(pushed.Companion.Key, first.Key) {
		t.Fatalf("warmstate push: %+v", pushed)
	}
	t.Logf("first start %.2fs (compiled %d files, %d bytes); companion uploaded %d bytes", first.Seconds, first.Files, first.Bytes, pushed.BytesUploaded)

	// Replica 2, elsewhere, pulls the companion of its key and loads.
	root2 := t.TempDir()
	mustRun(t, "warmstate", "pull", "--key", stubKey(t, stub, "-tp", "2", "-rank", "0"), pinned, root2)
	second := runStub(t, stub, root2, "-tp", "2", "-rank", "0")
	if second.Mode != "loaded" || second.Hash != first.Hash {
		t.Fatalf("second start did not load the first's cache: %+v", second)
	}
	t.Logf("second start %.2fs (loaded)", second.Seconds)

	// A key differing in one field (here tp, which changes the compile
	// hash too; and the driver alone, which does not) gets nothing.
	for _, args := range [][]string{{"-tp", "4", "-rank", "0"}, {"-tp", "2", "-rank", "0", "-driver", "560"}, {"-tp", "2", "-rank", "1"}} {
		k := stubKey(t, stub, args...)
		r := run(t, "warmstate", "pull", "--key", k, pinned, t.TempDir())
		if r.code == 0 || !strings.Contains(r.stderr, "no warm-state companion") {
			t.Fatalf("pull of key %s (%v):\n%s", k, args, r)
		}
	}

	// Rank 1's cache: its large kernels are rank 0's; only the small
	// per-rank files and the index are uploaded. Two replicas of rank 1
	// publish at once: one companion.
	rootA, rootB := t.TempDir(), t.TempDir()
	a := runStub(t, stub, rootA, "-tp", "2", "-rank", "1")
	b := runStub(t, stub, rootB, "-tp", "2", "-rank", "1")
	if a.Key != b.Key || a.Mode != "compiled" || b.Mode != "compiled" {
		t.Fatalf("rank 1 starts: %+v %+v", a, b)
	}
	var wg sync.WaitGroup
	results := make([]result, 2)
	for i, root := range []string{rootA, rootB} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = run(t, "warmstate", "push", "--json", "--holder", fmt.Sprint("replica-", i), "--key", a.Key, pinned, root)
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r.code != 0 && !strings.Contains(r.stderr, "lease") {
			t.Fatalf("publisher %d:\n%s", i, r)
		}
		if r.code == 0 {
			var p struct {
				BytesUploaded int64 `json:"bytes_uploaded"`
			}
			mustJSON(t, []byte(strings.TrimSpace(r.stdout)), &p)
			t.Logf("rank 1 publisher %d uploaded %d bytes of %d", i, p.BytesUploaded, a.Bytes)
		}
	}
	n := 0
	for _, c := range warmLs(t, pinned) {
		if sameKey(c.Key, a.Key) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d companions of %s after two publishers at once, want 1", n, a.Key)
	}

	// Signed: found under the policy; a copy with its key changed
	// (re-PUT with other annotations) is another digest, unsigned: refused.
	keys := t.TempDir()
	priv, pub := keyPair(t, keys, "warm")
	rootS := t.TempDir()
	s := runStub(t, stub, rootS, "-tp", "1", "-rank", "0", "-gpu", "A100", "-cc", "8.0")
	r := signRun(t, "warmstate", "push", "--json", "--sign-key", priv, "--key", s.Key, pinned, rootS)
	if r.code != 0 {
		t.Fatalf("signed push:\n%s", r)
	}
	var signed struct {
		Companion companionOut `json:"companion"`
	}
	mustJSON(t, []byte(strings.TrimSpace(r.stdout)), &signed)
	mustRun(t, "warmstate", "pull", "--require-signature", pub, "--key", s.Key, pinned, t.TempDir())
	forged := strings.Replace(signed.Companion.Key, "gpu=A100", "gpu=H200", 1)
	idx, _ := getManifest(t, reg, "models/warm", signed.Companion.Digest, "application/vnd.oci.image.index.v1+json")
	var m map[string]any
	mustJSON(t, idx, &m)
	ann := m["annotations"].(map[string]any)
	ann["dev.bdnvol.warmstate.key"] = forged
	ann["dev.bdnvol.warmstate.key.gpu"] = "H200"
	nb, _ := json.Marshal(m)
	nd := fmt.Sprintf("sha256:%x", sha256.Sum256(nb))
	putManifest(t, reg, "models/warm", nd, "application/vnd.oci.image.index.v1+json", nb)
	// distribution has no referrers API: the forger lists the copy in the
	// tag-schema index, as a client pushing a referrer does.
	fallback := "sha256-" + strings.TrimPrefix(v.Digest, "sha256:")
	fb, _ := getManifest(t, reg, "models/warm", fallback, "application/vnd.oci.image.index.v1+json")
	var fi map[string]any
	mustJSON(t, fb, &fi)
	fi["manifests"] = append(fi["manifests"].([]any), map[string]any{
		"mediaType": "application/vnd.oci.image.index.v1+json", "digest": nd, "size": len(nb),
		"artifactType": "application/vnd.bdnvol.warmstate.v1",
	})
	fb, _ = json.Marshal(fi)
	putManifest(t, reg, "models/warm", fallback, "application/vnd.oci.image.index.v1+json", fb)
	if r := run(t, "warmstate", "pull", "--require-signature", pub, "--key", forged, pinned, t.TempDir()); r.code == 0 || !strings.Contains(r.stderr, "refused") {
		t.Fatalf("forged key under --require-signature:\n%s", r)
	}
	mustRun(t, "warmstate", "pull", "--key", forged, pinned, t.TempDir()) // the copy is there: only the policy refuses it

	// The version deleted and purged takes its companions.
	all := warmLs(t, pinned)
	if len(all) != 4 {
		t.Fatalf("companions before the purge: %+v", all)
	}
	mustRun(t, "rm", "--force", pinned)
	mustRun(t, "gc", repo, "--keep-last", "0", "--keep-tag", "none", "--purge", "--restore-window", "0s", "--apply")
	for _, c := range all {
		req, _ := http.NewRequest(http.MethodGet, reg.URL+"/v2/models/warm/manifests/"+c.Digest, nil)
		req.Header.Set("Accept", "application/vnd.oci.image.index.v1+json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("companion %s after the purge: %d", c.Digest, resp.StatusCode)
		}
	}
}

// sameKey compares two k=v,... keys as sets of fields (the stand-in sorts
// "k=v" strings, bdnvol sorts by field name).
func sameKey(a, b string) bool {
	x, y := strings.Split(a, ","), strings.Split(b, ",")
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

// TestWarmStateMCV exports a companion as a Model Cache Vault compat image
// (one gzip layer under io.vllm.cache/, the cache labels) and imports it
// as the companion of another version, from which the stand-in loads.
func TestWarmStateMCV(t *testing.T) {
	stub := enginestub(t)
	reg := newDistribution(t)
	repo := reg.Host + "/models/mcv"
	v1 := pushJSON(t, repo+":v1", smallVolume(t, 1))
	v2 := pushJSON(t, repo+":v2", smallVolume(t, 2))
	root := t.TempDir()
	s := runStub(t, stub, root, "-small-files", "40", "-large-files", "1", "-large-size", "1048576")
	mustRun(t, "warmstate", "push", "--key", s.Key, repo+"@"+v1.Digest, root)

	image := reg.Host + "/caches/vllm:qwen"
	res := mustRun(t, "warmstate", "export", "--key", s.Key, repo+"@"+v1.Digest, image)
	pinned := strings.TrimSpace(res.stdout)
	mb, _ := getManifest(t, reg, "caches/vllm", "qwen", "application/vnd.oci.image.manifest.v1+json")
	var m struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
		Layers []struct {
			MediaType string `json:"mediaType"`
		} `json:"layers"`
	}
	mustJSON(t, mb, &m)
	if len(m.Layers) != 1 || m.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
		t.Fatalf("compat image layers: %+v", m.Layers)
	}
	var cfg struct {
		Config struct {
			Labels map[string]string `json:"Labels"`
		} `json:"config"`
	}
	mustJSON(t, getBlob(t, reg, "caches/vllm", m.Config.Digest), &cfg)
	var onDisk int64
	filepath.Walk(root, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			onDisk += fi.Size()
		}
		return err
	})
	if cfg.Config.Labels["cache.vllm.image/cache-size-bytes"] != fmt.Sprint(onDisk) || cfg.Config.Labels["cache.vllm.image/entry-count"] == "" {
		t.Fatalf("labels: %v (cache %d bytes)", cfg.Config.Labels, onDisk)
	}
	if again := mustRun(t, "warmstate", "export", "--key", s.Key, repo+"@"+v1.Digest, image); strings.TrimSpace(again.stdout) != pinned {
		t.Fatalf("export twice: %s, then %s", pinned, again.stdout)
	}

	// Imported (its key from the image's label) as v2's companion.
	mustRun(t, "warmstate", "import", pinned, repo+"@"+v2.Digest)
	root2 := t.TempDir()
	mustRun(t, "warmstate", "pull", "--key", s.Key, repo+"@"+v2.Digest, root2)
	if again := runStub(t, stub, root2, "-small-files", "40", "-large-files", "1", "-large-size", "1048576"); again.Mode != "loaded" {
		t.Fatalf("after an MCV round trip: %+v", again)
	}
}

// TestWarmStateCopy: `bdnvol copy` of a version carries its warm-state
// companions (referrers of the version, listed through the tag schema on
// distribution) and their signatures: the copy's companion is found by
// its key, passes --require-signature and loads; a copy into a layout
// and back again keeps them too.
func TestWarmStateCopy(t *testing.T) {
	stub := enginestub(t)
	reg := newDistribution(t)
	v := pushJSON(t, reg.Host+"/models/warmsrc:v1", smallVolume(t, 1))
	src := reg.Host + "/models/warmsrc@" + v.Digest
	root := t.TempDir()
	first := runStub(t, stub, root, "-tp", "2")
	priv, pub := keyPair(t, t.TempDir(), "warm")
	if r := signRun(t, "warmstate", "push", "--key", first.Key, "--sign-key", priv, src, root); r.code != 0 {
		t.Fatalf("signed push:\n%s", r)
	}
	other := runStub(t, stub, t.TempDir(), "-tp", "4")
	if other.Mode != "compiled" {
		t.Fatalf("tp=4: %+v", other)
	}

	lay := "oci:" + filepath.Join(t.TempDir(), "lay")
	for _, dst := range []string{reg.Host + "/models/warmdst", lay, reg.Host + "/models/warmback"} {
		from := src
		if dst == reg.Host+"/models/warmback" {
			from = lay + "@" + v.Digest
		}
		mustRun(t, "copy", from, dst)
		pinned := dst + "@" + v.Digest
		cs := warmLs(t, pinned)
		if len(cs) != 1 || !sameKey(cs[0].Key, first.Key) || cs[0].Error != "" {
			t.Fatalf("companions of the copy in %s: %+v", dst, cs)
		}
		dir := t.TempDir()
		mustRun(t, "warmstate", "pull", "--key", first.Key, "--require-signature", pub, pinned, dir)
		if s := runStub(t, stub, dir, "-tp", "2"); s.Mode != "loaded" || s.Hash != first.Hash {
			t.Fatalf("the stand-in on the copy's companion from %s: %+v", dst, s)
		}
		if r := run(t, "warmstate", "pull", "--key", other.Key, pinned, t.TempDir()); r.code == 0 {
			t.Fatalf("pull of a key never pushed from %s:\n%s", dst, r)
		}
	}
}

// TestWarmStateGC: `gc --drop-unused-warmstate` with a deploy file as
// references deletes the companion whose key no warm-state volume there
// uses and keeps the one a volume uses (its key without the node's fields);
// without --apply it only lists it.
func TestWarmStateGC(t *testing.T) {
	reg := newDistribution(t)
	repo := reg.Host + "/models/warmgc"
	v := pushJSON(t, repo+":v1", smallVolume(t, 1))
	pinned := repo + "@" + v.Digest
	for _, key := range []string{"engine=vllm,tp=1,gpu=H100,driver=550", "engine=vllm,tp=2,gpu=H100,driver=550"} {
		dir := t.TempDir()
		mustWrite(t, filepath.Join(dir, "kernel.bin"), []byte("kernel "+key))
		mustRun(t, "warmstate", "push", "--key", key, pinned, dir)
	}
	deploy := filepath.Join(t.TempDir(), "deploy.yaml")
	mustWrite(t, deploy, []byte(fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
spec:
  template:
    spec:
      volumes:
        - name: cache
          csi:
            driver: csi.bdnvol.dev
            volumeAttributes: {ref: %q, warmstateKey: "engine=vllm,tp=1"}
`, pinned)))
	dry := mustRun(t, "gc", "--refs", deploy, "--drop-unused-warmstate", repo)
	if strings.Count(dry.stdout, "WARMSTATE") != 1 || !strings.Contains(dry.stdout, "tp=2: unused") || len(warmLs(t, pinned)) != 2 {
		t.Fatalf("dry run:\n%s", dry)
	}
	res := mustRun(t, "gc", "--refs", deploy, "--drop-unused-warmstate", "--apply", repo)
	cs := warmLs(t, pinned)
	if len(cs) != 1 || !sameKey(cs[0].Key, "engine=vllm,tp=1,gpu=H100,driver=550") || !strings.Contains(res.stdout, "deleted") {
		t.Fatalf("after gc --apply: %+v\n%s", cs, res)
	}
}
