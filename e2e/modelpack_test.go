package e2e

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// checkModelTree checks that dir holds exactly the model's files, byte for
// byte (directories aside).
func checkModelTree(t *testing.T, dir string, m *mpModel) {
	t.Helper()
	got := map[string]bool{}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		got[filepath.ToSlash(rel)] = true
		if !fi.Mode().IsRegular() {
			t.Errorf("%s: mode %s, want a regular file", rel, fi.Mode())
		}
		return nil
	})
	for p, want := range m.files {
		if !got[p] {
			t.Errorf("%s: missing", p)
			continue
		}
		if b := fileContents(t, filepath.Join(dir, filepath.FromSlash(p))); !bytes.Equal(b, want) {
			t.Errorf("%s: %d bytes differ from the model's %d", p, len(b), len(want))
		}
		delete(got, p)
	}
	for p := range got {
		t.Errorf("%s: not a file of the model", p)
	}
}

// TestModelPackPullInspect pulls a ModelPack model of every packing (raw,
// tar with a PAX name, tar+gzip, doc and code layers) by digest from each
// registry and an OCI layout: the tree is the model's files byte for byte,
// and inspect lists them, saying which are lazy.
func TestModelPackPullInspect(t *testing.T) {
	forTargets(t, func(t *testing.T, tg target) {
		m := mixedModel(t)
		ref := m.push(t, tg, "mp/mixed", "v1")
		dir := filepath.Join(t.TempDir(), "out")
		mustRun(t, "pull", ref, dir)
		checkModelTree(t, dir, m)

		out := mustRun(t, "inspect", ref).stdout
		for p := range m.files {
			if !strings.Contains(out, p) {
				t.Errorf("inspect does not list %s:\n%s", p, out)
			}
		}
		if !strings.Contains(out, "modelpack") {
			t.Errorf("inspect does not say it is a ModelPack model:\n%s", out)
		}
		if !strings.Contains(out, "streamed") {
			t.Errorf("inspect does not say which files are streamed whole:\n%s", out)
		}
	})
}

// TestModelPackHostile: models whose tars hold links or climb out of the
// root, or whose paths repeat, fail the pull with an error naming the
// problem, and nothing is written outside the target.
func TestModelPackHostile(t *testing.T) {
	reg := newDistribution(t)
	tg := target{name: "distribution", reg: reg}
	cases := []struct {
		name, mention string
		layers        []mpLayer
	}{
		{"traversal", "leaves the model's root", []mpLayer{{mpType("weight", "tar"), mpTar(t, false, mpMember{name: "../outside/keep", data: []byte("owned")}), "x"}}},
		{"raw traversal", "leaves the model's root", []mpLayer{{mpType("weight", "raw"), []byte("owned"), "../../x/outside/keep"}}},
		{"symlink", "is a link", []mpLayer{{mpType("weight", "tar"), mpTar(t, false, mpMember{name: "w", typ: tar.TypeSymlink, link: "../../outside"}), "w"}}},
		{"hard link", "is a link", []mpLayer{{mpType("weight", "tar+gzip"), mpTar(t, true, mpMember{name: "w", typ: tar.TypeLink, link: "/etc/passwd"}), "w"}}},
		{"duplicate", "is in layer 0 and layer 1", []mpLayer{{mpType("weight", "raw"), []byte("1"), "w"}, {mpType("doc", "raw"), []byte("2"), "./w"}}},
		{"absolute", "is absolute", []mpLayer{{mpType("doc", "raw"), []byte("1"), "/etc/passwd"}}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			site := newPullSite(t)
			m := newModel(t, nil, c.layers...)
			ref := m.push(t, tg, "mp/hostile", "h"+string(rune('a'+i)))
			res := run(t, "pull", ref, site.dst)
			site.checkFailedPull(t, res, ref, []string{c.mention}, nil)
		})
	}
}

// bigRawModel is a model whose weights are one 256 MiB raw safetensors
// layer of eight 32 MiB tensors (and a README): the file, the tensors'
// offsets and sizes.
func bigRawModel(t *testing.T) (*mpModel, []byte, []int64, []int) {
	sizes := make([]int, 8)
	for i := range sizes {
		sizes[i] = 32 << 20
	}
	w, starts := mpSafetensors(sizes...)
	m := newModel(t, map[string][]byte{"model.safetensors": w},
		mpLayer{mpType("weight", "raw"), w, "model.safetensors"},
		mpLayer{mpType("doc", "raw"), []byte("# big\n"), "README.md"})
	return m, w, starts, sizes
}

// readTensor reads tensor k of the weights file at p and checks its bytes.
func readTensor(t *testing.T, p string, w []byte, starts []int64, sizes []int, k int) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, sizes[k])
	if _, err := f.ReadAt(got, starts[k]); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, w[starts[k]:starts[k]+int64(sizes[k])]) {
		t.Fatalf("tensor %d read through the mount differs from the model's", k)
	}
}

// checkOneTensor checks what reading one tensor of n bytes cost: at most
// three registry requests and 1.1 times its bytes.
func checkOneTensor(t *testing.T, what string, st stats, n int) {
	t.Helper()
	t.Logf("%s: one tensor of %d bytes: %d requests (%v), %d blob bytes (%.3fx)", what, n, total(st.Requests), st.Requests, st.BlobBytesOut, float64(st.BlobBytesOut)/float64(n))
	if c := total(st.Requests); c > 3 {
		t.Errorf("%s: reading one tensor took %d registry requests, want at most 3: %v", what, c, st.Requests)
	}
	if st.BlobBytesOut > int64(float64(n)*1.1) {
		t.Errorf("%s: reading one tensor of %d bytes fetched %d bytes, more than 1.1x", what, n, st.BlobBytesOut)
	}
}

// TestModelPackMountOneTensor mounts a model whose weights are one large
// raw layer and reads one tensor from its middle: after the mount is up,
// the read costs at most three registry requests and at most 1.1 times the
// tensor's bytes. The first open reads every layer once, whole, to verify
// it and cut it into chunks, and keeps the derived index in the cache
// directory; a second mount (the chunk cache emptied) reads the manifest
// and the safetensors header, no layer.
func TestModelPackMountOneTensor(t *testing.T) {
	requireFUSE(t)
	reg := newDistribution(t)
	m, w, starts, sizes := bigRawModel(t)
	ref := m.push(t, target{name: "distribution", reg: reg}, "mp/big", "v1")
	cache := filepath.Join(t.TempDir(), "cache")
	for i, round := range []string{"cold", "index kept"} {
		reg.ResetStats()
		mp := mount(t, ref, "--cache-dir", cache)
		reg.Settle(t)
		open := reg.Stats()
		t.Logf("%s: opening the mount: %d requests (%v), %d blob bytes (the layers are %d bytes)", round, total(open.Requests), open.Requests, open.BlobBytesOut, len(w)+6)
		if i == 0 && open.BlobBytesOut < int64(len(w)) {
			t.Errorf("cold open fetched %d bytes: the layer was not read whole", open.BlobBytesOut)
		}
		if i == 1 && open.BlobBytesOut > 1<<20 {
			t.Errorf("open with the index kept fetched %d bytes, want the manifest and headers only (under 1 MiB)", open.BlobBytesOut)
		}
		if !hasIndexRecord(filepath.Join(cache, "indexes"), m.digest) {
			t.Errorf("%s: no index record kept", round)
		}
		reg.ResetStats()
		readTensor(t, filepath.Join(mp, "model.safetensors"), w, starts, sizes, 4)
		reg.Settle(t)
		checkOneTensor(t, round, reg.Stats(), sizes[4])
		mustRun(t, "umount", mp)
		if err := os.RemoveAll(filepath.Join(cache, "chunks")); err != nil {
			t.Fatal(err)
		}
	}
}

// total sums request counts.
func total(reqs map[string]int) int {
	n := 0
	for _, v := range reqs {
		n += v
	}
	return n
}

// hasIndexRecord reports whether dir holds an index record of the model
// digest: unscoped (sha256-HEX) or kept for one origin (sha256-HEX-ORIGIN,
// as a mount keeps it).
func hasIndexRecord(dir, digest string) bool {
	ms, _ := filepath.Glob(filepath.Join(dir, "sha256-"+strings.TrimPrefix(digest, "sha256:")+"*"))
	return len(ms) > 0
}
