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

// TestHarnessRegistries checks the harness itself, without the CLI: both
// registries accept a crafted version, count bytes, and corrupt on request.
func TestHarnessRegistries(t *testing.T) {
	for _, kind := range []string{"distribution", "ggcr"} {
		t.Run(kind, func(t *testing.T) {
			var reg *registry
			if kind == "distribution" {
				reg = newDistribution(t)
			} else {
				reg = newGGCR(t)
			}
			if !strings.HasPrefix(reg.Host, "127.0.0.1:") {
				t.Fatalf("registry not on loopback: %s", reg.Host)
			}
			chunk := randBytes(1, 1000)
			v := craft(t, fileIndex{Files: []indexEntry{fileEntry("f", 0o644, chunk, 0)}}, [][]byte{chunk})
			pushVersion(t, reg, "test/repo", "v1", v)
			st := reg.Stats()
			want := int64(2 + len(chunk))
			for d, b := range v.blobs {
				if d != emptyDigest && d != v.index.Chunks[0].Digest {
					want += int64(len(b)) // the file index
				}
			}
			if st.BlobBytesIn != want {
				t.Errorf("BlobBytesIn = %d, want %d", st.BlobBytesIn, want)
			}
			if st.Requests["POST upload"] != 3 || st.Requests["PUT upload"] != 3 || st.Requests["PUT manifest"] != 1 {
				t.Errorf("requests = %v", st.Requests)
			}

			body, ct := getManifest(t, reg, "test/repo", "v1", manifestAccepts)
			if !bytes.Equal(body, v.manifest) || ct != mtManifest {
				t.Fatalf("manifest round trip: %s %s", ct, body)
			}
			var m ociManifest
			mustJSON(t, body, &m)
			if m.ArtifactType != mtVolume || len(m.Layers) != 2 {
				t.Fatalf("manifest: %+v", m)
			}

			reg.ResetStats()
			if got := getBlob(t, reg, "test/repo", digestOf(chunk)); !bytes.Equal(got, chunk) {
				t.Fatal("blob differs")
			}
			if st := reg.Stats(); st.BlobBytesOut != int64(len(chunk)) || st.Requests["GET blob"] != 1 {
				t.Errorf("after one GET: %+v", st)
			}
			reg.Corrupt(digestOf(chunk))
			got := getBlob(t, reg, "test/repo", digestOf(chunk))
			if len(got) != len(chunk) || bytes.Equal(got, chunk) || digestOf(got) == digestOf(chunk) {
				t.Fatal("Corrupt did not corrupt the blob")
			}
			if got[0] != ^chunk[0] || !bytes.Equal(got[1:], chunk[1:]) {
				t.Fatal("Corrupt should flip exactly the first byte")
			}
			// Other blobs stay intact.
			if got := getBlob(t, reg, "test/repo", emptyDigest); string(got) != "{}" {
				t.Fatalf("empty blob: %q", got)
			}
		})
	}
}

// TestHarnessTrees checks the tree builder and comparator.
func TestHarnessTrees(t *testing.T) {
	nodes := []node{
		dirNode("a", 0o700),
		fileNode("a/x", 0o600, []byte("x")),
		fileNode("b", 0o755, nil),
		linkNode("l", "a/x"),
		dirNode("empty", 0o755),
		fileNode("données/模型.bin", 0o644, randBytes(2, 100)),
	}
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	buildTree(t, a, nodes, time.Time{})
	rev := append([]node(nil), nodes...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	buildTree(t, b, rev, time.Unix(1e9, 0))
	compareTrees(t, a, b)

	sa := snapshot(t, a)
	if len(sa) != 7 || sa["a"].Perm != 0o700 || sa["l"].Target != "a/x" || sa["empty"].Type != "dir" || sa["données"].Type != "dir" {
		t.Fatalf("snapshot: %v", sa)
	}
	check := func(what string, mutate func(), restore func()) {
		t.Helper()
		mutate()
		if len(diffSnapshots(sa, snapshot(t, b))) == 0 {
			t.Errorf("comparator missed: %s", what)
		}
		restore()
		if d := diffSnapshots(sa, snapshot(t, b)); len(d) != 0 {
			t.Fatalf("restore after %s: %v", what, d)
		}
	}
	p := func(s string) string { return filepath.Join(b, s) }
	check("mode", func() { os.Chmod(p("b"), 0o644) }, func() { os.Chmod(p("b"), 0o755) })
	check("dir mode", func() { os.Chmod(p("a"), 0o755) }, func() { os.Chmod(p("a"), 0o700) })
	check("content", func() { os.WriteFile(p("b"), []byte("z"), 0) }, func() { os.WriteFile(p("b"), nil, 0) })
	check("target", func() { os.Remove(p("l")); os.Symlink("b", p("l")) }, func() { os.Remove(p("l")); os.Symlink("a/x", p("l")) })
	check("empty dir", func() { os.Remove(p("empty")) }, func() { os.Mkdir(p("empty"), 0o755) })
	check("extra", func() { os.WriteFile(p("c"), nil, 0o644) }, func() { os.Remove(p("c")) })
	check("type", func() { os.Remove(p("b")); os.Symlink("x", p("b")) }, func() { os.Remove(p("b")); os.WriteFile(p("b"), nil, 0); os.Chmod(p("b"), 0o755) })
}

// TestHarnessLayout checks that a crafted OCI layout is well formed.
func TestHarnessLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "layout")
	chunk := []byte("hello")
	v := craft(t, fileIndex{Files: []indexEntry{fileEntry("f", 0o644, chunk, 0)}}, [][]byte{chunk})
	writeLayout(t, dir, "v1", v)
	var idx struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	mustJSON(t, fileContents(t, filepath.Join(dir, "index.json")), &idx)
	if len(idx.Manifests) != 1 || idx.Manifests[0].Digest != v.digest || idx.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v1" {
		t.Fatalf("index.json: %+v", idx)
	}
	var m ociManifest
	if err := json.Unmarshal(layoutBlob(t, dir, v.digest), &m); err != nil || m.Layers[1].Digest != digestOf(chunk) {
		t.Fatalf("manifest: %+v %v", m, err)
	}
}
