package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestModelPackReadPaths runs every read path but mount and pull (tested
// apart) on a ModelPack model of every packing, on distribution: inspect
// says which files are lazy; verify checks a pulled tree and names a
// changed file; a model signed with `bdnvol sign` is accepted by
// --require-signature (pull, mount, verify --key) and an unsigned one
// refused; bdnvol.yaml with requireSignature mounts it; pin and lint pin
// and check its tag; the derived index is kept (a second inspect reads no
// blob) and a torn record is derived again; cache warm fills the cache so
// that a mount reads no blob of the registry.
func TestModelPackReadPaths(t *testing.T) {
	requireFUSE(t)
	reg := newDistribution(t)
	tg := target{name: "distribution", reg: reg}
	m := mixedModel(t)
	ref := m.push(t, tg, "mp/paths", "v1")
	repo := reg.Host + "/mp/paths"
	digest := m.digest

	t.Run("inspect", func(t *testing.T) {
		out := mustRun(t, "inspect", repo+":v1").stdout
		if !strings.Contains(out, "format:    modelpack (read-only)") {
			t.Errorf("inspect does not name the format:\n%s", out)
		}
		lazy := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "lazy:") {
				lazy = l
			}
		}
		// Seven files; the two of the tar+gzip layer are streamed whole.
		if !strings.Contains(lazy, "5 of 7 files read by range") || !strings.HasSuffix(lazy, "streamed whole: config.json tokenizer.json") {
			t.Errorf("inspect's lazy line is %q, want 5 of 7 by range and config.json tokenizer.json streamed whole", lazy)
		}
		var d struct {
			Digest   string   `json:"digest"`
			Foreign  string   `json:"foreign"`
			Streamed []string `json:"streamed"`
		}
		mustJSON(t, []byte(mustRun(t, "inspect", "--json", ref).stdout), &d)
		if d.Digest != digest || d.Foreign != mpArtifact || strings.Join(d.Streamed, ",") != "config.json,tokenizer.json" {
			t.Errorf("inspect --json: %+v", d)
		}
	})

	t.Run("verify", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "out")
		mustRun(t, "pull", ref, dir)
		if res := mustRun(t, "verify", ref, dir); res.code != 0 {
			t.Fatalf("verify of a fresh pull:\n%s", res)
		}
		p := filepath.Join(dir, "shards", "a.bin")
		b := fileContents(t, p)
		b[1000] ^= 1
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if res := run(t, "verify", ref, dir); res.code != 1 || !strings.Contains(res.stdout+res.stderr, "shards/a.bin") {
			t.Fatalf("verify of a changed file should exit 1 naming it:\n%s", res)
		}
	})

	keys := t.TempDir()
	key, pub := keyPair(t, keys, "release")
	if res := signRun(t, "sign", "--key", key, ref); res.code != 0 {
		t.Fatalf("sign of a ModelPack model:\n%s", res)
	}
	other := newModel(t, map[string][]byte{"w.bin": []byte("unsigned weights")}, mpLayer{mpType("weight", "raw"), []byte("unsigned weights"), "w.bin"})
	unsigned := other.push(t, tg, "mp/paths", "unsigned")

	t.Run("require-signature", func(t *testing.T) {
		if res := run(t, "verify", "--key", pub, ref); res.code != 0 || !strings.Contains(res.stdout, "verified") {
			t.Fatalf("verify --key of the signed model:\n%s", res)
		}
		dir := filepath.Join(t.TempDir(), "signed")
		if res := run(t, "pull", "--require-signature", pub, repo+":v1", dir); res.code != 0 {
			t.Fatalf("pull --require-signature of the signed model:\n%s", res)
		}
		checkModelTree(t, dir, m)
		mp, res := tryMount(t, ref, "--require-signature", pub, "--prefetch", "none")
		if res.code != 0 {
			t.Fatalf("mount --require-signature of the signed model:\n%s", res)
		}
		checkModelTree(t, mp, m)
		mustRun(t, "umount", mp)

		dst := filepath.Join(t.TempDir(), "unsigned")
		res = run(t, "pull", "--require-signature", pub, unsigned, dst)
		if res.code == 0 || !strings.Contains(res.stderr, other.digest) || !strings.Contains(res.stderr, "no signature") {
			t.Fatalf("pull --require-signature of an unsigned model: want a refusal naming it:\n%s", res)
		}
		if _, err := os.Stat(filepath.Join(dst, "w.bin")); err == nil {
			t.Fatal("the refused pull wrote the model's file")
		}
		if _, res := tryMount(t, unsigned, "--require-signature", pub); res.code == 0 || !strings.Contains(res.stderr, "no signature") {
			t.Fatalf("mount --require-signature of an unsigned model: want a refusal:\n%s", res)
		}
		if res := run(t, "verify", "--key", pub, unsigned); res.code == 0 {
			t.Fatalf("verify --key of an unsigned model passed:\n%s", res)
		}
	})

	t.Run("bdnvol.yaml pin lint", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "release.pub"), mustRead(t, pub), 0o644); err != nil {
			t.Fatal(err)
		}
		spec := filepath.Join(dir, "bdnvol.yaml")
		mustWrite(t, spec, []byte("requireSignature: release.pub\nmounts:\n  - source: "+repo+":v1\n    path: /models/m\n    readOnly: true\n"))
		if r := run(t, "lint", spec); r.code != 1 || !strings.Contains(r.stdout, spec+":3: "+repo+":v1: not pinned") {
			t.Fatalf("lint of an unpinned ModelPack source should exit 1 naming file:line:\n%s", r)
		}
		mustRun(t, "pin", spec)
		if got := string(fileContents(t, spec)); !strings.Contains(got, "source: "+repo+":v1@"+digest+"\n") {
			t.Fatalf("pin did not pin the model's tag to its manifest digest:\n%s", got)
		}
		mustRun(t, "lint", spec)

		root := filepath.Join(dir, "root")
		mp := filepath.Join(root, "models", "m")
		t.Cleanup(func() { forceUnmount(t, mp) })
		res := mustRun(t, "mount", "--daemon", "--prefetch", "none", "--spec", spec, root)
		if strings.TrimSpace(res.stdout) != repo+"@"+digest {
			t.Fatalf("mount --spec printed %q, want %s@%s", res.stdout, repo, digest)
		}
		checkModelTree(t, mp, m)
		mustRun(t, "umount", root)

		// The tag moves to the unsigned model: lint says so.
		putManifest(t, reg, "mp/paths", "v1", mtManifest, other.manifest)
		if r := run(t, "lint", spec); r.code != 1 || !strings.Contains(r.stdout, "v1 moved since this was pinned") {
			t.Fatalf("lint after the model's tag moved:\n%s", r)
		}
		putManifest(t, reg, "mp/paths", "v1", mtManifest, m.manifest)
	})

	t.Run("index record torn", func(t *testing.T) {
		// The first inspect derives the index from the layers and keeps it;
		// the second reads no layer; a torn record is dropped, the layers
		// read again, and the same record written back.
		cache := filepath.Join(t.TempDir(), "cache")
		record := filepath.Join(cache, "indexes", "sha256-"+strings.TrimPrefix(digest, "sha256:"))
		var layers int64
		for _, l := range m.layers {
			layers += int64(len(l.blob))
		}
		inspect := func() (string, int64) {
			reg.ResetStats()
			out := mustRun(t, "inspect", "--cache-dir", cache, ref).stdout
			return out, reg.Stats().BlobBytesOut
		}
		want, n := inspect()
		if n < layers {
			t.Fatalf("first inspect fetched %d blob bytes, less than the layers' %d", n, layers)
		}
		good, err := os.ReadFile(record)
		if err != nil {
			t.Fatalf("no record kept: %v", err)
		}
		if out, n := inspect(); out != want || n != 0 {
			t.Fatalf("inspect with the record kept fetched %d blob bytes (want none), or printed otherwise:\n%s", n, out)
		}
		if err := os.WriteFile(record, good[:len(good)/2], 0o600); err != nil {
			t.Fatal(err)
		}
		if out, n := inspect(); out != want || n < layers {
			t.Fatalf("inspect with a torn record fetched %d blob bytes (want the layers again, %d), or printed otherwise:\n%s", n, layers, out)
		}
		if now, _ := os.ReadFile(record); !bytes.Equal(now, good) {
			t.Fatal("the torn record was not written back as derived")
		}
	})

	t.Run("cache warm", func(t *testing.T) {
		cache := filepath.Join(t.TempDir(), "cache")
		mustRun(t, "cache", "warm", "--cache-dir", cache, ref)
		var ls []struct {
			Pinned   string `json:"pinned"`
			Complete bool   `json:"complete"`
		}
		if err := json.Unmarshal([]byte(mustRun(t, "cache", "ls", "--cache-dir", cache, "--json").stdout), &ls); err != nil {
			t.Fatal(err)
		}
		if len(ls) != 1 || ls[0].Pinned != ref || !ls[0].Complete {
			t.Fatalf("cache ls after warming the model: %+v, want it complete", ls)
		}
		reg.ResetStats()
		mp := mount(t, ref, "--cache-dir", cache, "--prefetch", "none")
		checkModelTree(t, mp, m)
		reg.Settle(t)
		if st := reg.Stats(); st.Requests["GET blob"] != 0 || st.BlobBytesOut != 0 {
			t.Errorf("a mount of the warmed model read every file with %d blob GETs (%d bytes), want none: %v", st.Requests["GET blob"], st.BlobBytesOut, st.Requests)
		}
		mustRun(t, "umount", mp)
	})
}

// TestModelPackCSIOneTensor publishes a model whose weights are one large
// raw layer through the CSI node plugin (the real mounter and node
// processes, a real FUSE mount) and reads one tensor from its middle at
// the pod's target: at most three registry requests and 1.1 times the
// tensor's bytes, counted at the registry. The mounter keeps the derived
// index under its cache directory. The volume asks for prefetch: headers,
// as a mount's default does: the safetensors header, which the plugin (and
// any loader) reads once before the first tensor, is fetched with the
// mount. (Without it, the first tensor read also fetches the header and
// its page: two requests, 262,768 bytes more.)
func TestModelPackCSIOneTensor(t *testing.T) {
	reg := newDistribution(t)
	m, w, starts, sizes := bigRawModel(t)
	ref := m.push(t, target{name: "distribution", reg: reg}, "mp/csi", "v1")
	n := startCSI(t, time.Minute)
	p := n.newPod("mp-tensor")
	reg.ResetStats()
	if err := n.publishWith(p, ref, "", map[string]string{"prefetch": "headers"}); err != nil {
		t.Fatal(err)
	}
	reg.Settle(t)
	open := reg.Stats()
	t.Logf("CSI: publishing the model: %d requests (%v), %d blob bytes (the layers are %d bytes)", total(open.Requests), open.Requests, open.BlobBytesOut, len(w)+6)
	if !hasIndexRecord(filepath.Join(n.cacheDir, "indexes"), m.digest) {
		t.Error("the mounter kept no index record")
	}
	reg.ResetStats()
	readTensor(t, filepath.Join(p.target, "model.safetensors"), w, starts, sizes, 4)
	reg.Settle(t)
	checkOneTensor(t, "CSI", reg.Stats(), sizes[4])
	if err := n.unpublish(p); err != nil {
		t.Fatal(err)
	}
}

// TestModelPackVersionsGC: `versions` lists a ModelPack model tagged in a
// repository of sealed versions, apart from them (read-only, by tag, with
// --json entries that carry "foreign"); gc plans and deletes only sealed
// versions: the model is not in its plan, and still pulls after gc --apply.
func TestModelPackVersionsGC(t *testing.T) {
	forKinds(t, []string{"distribution", "oci-layout"}, func(t *testing.T, tg target) {
		m := mixedModel(t)
		ref := m.push(t, tg, "mp/gc", "model") // first: a layout's index.json is written whole
		repo := tg.repo("mp/gc")
		v1 := pushJSON(t, repo+":v1", smallVolume(t, 31))
		v2 := pushJSON(t, repo+":v2", smallVolume(t, 32))

		out := mustRun(t, "versions", repo).stdout
		sections := strings.SplitN(out, "\nmodels (read-only", 2)
		if len(sections) != 2 || !strings.Contains(sections[0], v1.Digest) || !strings.Contains(sections[0], v2.Digest) ||
			strings.Contains(sections[0], m.digest) || !strings.Contains(sections[1], m.digest) || !strings.Contains(sections[1], "modelpack") {
			t.Fatalf("versions should list the two versions, then the model apart:\n%s", out)
		}
		var list []map[string]any
		mustJSON(t, []byte(mustRun(t, "versions", "--json", repo).stdout), &list)
		foreign := 0
		for _, e := range list {
			if e["foreign"] == mpArtifact {
				foreign++
				if e["digest"] != m.digest || len(e["tags"].([]any)) != 1 || e["tags"].([]any)[0] != "model" {
					t.Errorf("versions --json model entry: %v", e)
				}
			} else if _, ok := e["sealed_tag"]; !ok {
				t.Errorf("versions --json version entry without sealed_tag: %v", e)
			}
		}
		if len(list) != 3 || foreign != 1 {
			t.Fatalf("versions --json: %d entries, %d models; want 3 and 1:\n%v", len(list), foreign, list)
		}

		plan := mustRun(t, "gc", "--keep-last", "1", "--keep-tag", "none-such", repo)
		if strings.Contains(plan.stdout, m.digest) || !strings.Contains(plan.stdout, v1.Digest) {
			t.Fatalf("gc plan should delete v1 only, never name the model:\n%s", plan)
		}
		mustRun(t, "gc", "--apply", "--purge", "--restore-window", "0s", "--blob-grace", "0s", "--keep-last", "1", "--keep-tag", "none-such", repo)
		dir := filepath.Join(t.TempDir(), "out")
		mustRun(t, "pull", ref, dir)
		checkModelTree(t, dir, m)
		if out := mustRun(t, "versions", repo).stdout; !strings.Contains(out, m.digest) || strings.Contains(out, v1.Digest) {
			t.Fatalf("versions after gc: want the model listed and v1 gone:\n%s", out)
		}
	})
}
