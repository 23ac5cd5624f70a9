package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeSmallFiles writes n files of size bytes in 100 directories under
// root; file i's bytes depend on i only.
func writeSmallFiles(t *testing.T, root string, n, size int) {
	t.Helper()
	for d := range 100 {
		if err := os.MkdirAll(filepath.Join(root, fmt.Sprintf("d%02d", d)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	buf := randBytes(7, n+size)
	for i := range n {
		p := filepath.Join(root, fmt.Sprintf("d%02d", i%100), fmt.Sprintf("f%06d.bin", i))
		if err := os.WriteFile(p, buf[i:i+size], 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFormatV2SmallChange pushes 100,000 files of 1 KiB, changes one byte
// of one file and pushes again: the second push uploads the pack around
// the file, the index pieces that name it and the top-level blobs, at most
// 2 MB in all as the registry counts them, where a one-blob index alone
// was 33 MB.
func TestFormatV2SmallChange(t *testing.T) {
	bin(t)
	reg := newDistribution(t)
	repo := reg.Host + "/data/small"
	src := filepath.Join(t.TempDir(), "src")
	start := time.Now()
	writeSmallFiles(t, src, 100_000, 1<<10)
	t.Logf("wrote 100,000 files in %v", time.Since(start))

	start = time.Now()
	first := dedupPushJSON(t, repo+":v1", src)
	t.Logf("first push: %d bytes, %d chunks in %v", first.Bytes, first.Chunks, time.Since(start))
	m, idx := checkRoot(t, target{reg: reg, name: "registry"}, "data/small", first.Digest)
	if m.Layers[0].MediaType != mtTopIndex || idx == nil || len(idx.Files) != 100_100 {
		t.Fatalf("first layer %s: want a format version 2 index of 100,100 entries", m.Layers[0].MediaType)
	}

	p := filepath.Join(src, "d21", "f054321.bin")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	reg.ResetStats()
	start = time.Now()
	second := dedupPushJSON(t, repo+":v2", src)
	elapsed := time.Since(start)
	body, _ := getManifest(t, reg, "data/small", second.Digest, manifestAccepts)
	total := reg.Stats().BlobBytesIn + int64(len(body))
	t.Logf("one file changed: registry got %d blob bytes + a %d-byte manifest; push says %d bytes uploaded, %d chunks; %v",
		reg.Stats().BlobBytesIn, len(body), second.BytesUploaded, second.ChunksUploaded, elapsed)
	if second.Digest == first.Digest {
		t.Fatal("a changed file kept the digest")
	}
	if total > 2_000_000 || second.BytesUploaded > 2_000_000 {
		t.Errorf("one changed 1 KiB file re-uploaded %d bytes (push says %d), want at most 2 MB", total, second.BytesUploaded)
	}
	if second.ChunksUploaded < 1 || second.ChunksUploaded > 2 {
		t.Errorf("%d chunks uploaded for one changed small file, want the pack around it (one or two)", second.ChunksUploaded)
	}

	// The same tree pushed again is the same version and uploads nothing.
	reg.ResetStats()
	again := dedupPushJSON(t, repo+":v3", src)
	if again.Digest != second.Digest || reg.Stats().BlobBytesIn != 0 {
		t.Errorf("the same tree pushed to %s (was %s), uploading %d blob bytes", again.Digest, second.Digest, reg.Stats().BlobBytesIn)
	}
}

// TestFormatV1StillReads: a version in format version 1 (one index blob,
// as bdnvol wrote before format version 2) still pulls bit-exact and
// mounts.
func TestFormatV1StillReads(t *testing.T) {
	bin(t)
	reg := newDistribution(t)
	a, b := randBytes(1, 3000), randBytes(2, 500)
	nodes := []node{dirNode("data", 0o755), fileNode("data/a.bin", 0o644, a), fileNode("data/b.txt", 0o600, b), linkNode("latest", "data/a.bin")}
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, nodes, time.Time{})

	chunk := append(append([]byte{}, a...), b...)
	idx := fileIndex{Version: 1, Files: []indexEntry{
		{Path: "data", Type: "dir", Mode: 0o755},
		{Path: "data/a.bin", Type: "file", Mode: 0o644, Size: int64(len(a)), Digest: digestOf(a), Extents: [][3]int64{{0, 0, int64(len(a))}}},
		{Path: "data/b.txt", Type: "file", Mode: 0o600, Size: int64(len(b)), Digest: digestOf(b), Extents: [][3]int64{{0, int64(len(a)), int64(len(b))}}},
		{Path: "latest", Type: "symlink", Mode: 0o777, Target: "data/a.bin"},
	}}
	v := craft(t, idx, [][]byte{chunk})
	pushVersion(t, reg, "old/v1", "v1", v)
	ref := reg.Host + "/old/v1:v1"
	if _, got := checkRoot(t, target{reg: reg, name: "registry"}, "old/v1", v.digest); got == nil || got.Version != 1 {
		t.Fatalf("the crafted version is not format version 1: %+v", got)
	}

	dst := filepath.Join(t.TempDir(), "dst")
	pull(t, ref, dst)
	compareTrees(t, src, dst)

	res := mustRun(t, "inspect", "--json", ref)
	if !strings.Contains(res.stdout, `"format_version":1`) || !strings.Contains(res.stdout, `"data/b.txt"`) {
		t.Errorf("inspect of a version 1 volume:\n%s", res.stdout)
	}

	mp := mount(t, ref)
	compareTrees(t, src, mp)
}
