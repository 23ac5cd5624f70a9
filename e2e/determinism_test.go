package e2e

import (
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func determinismTree() []node {
	return []node{
		dirNode("a", 0o755),
		fileNode("a/one", 0o644, randBytes(20, 200<<10)),
		fileNode("a/two", 0o600, randBytes(21, 1<<20)),
		dirNode("a/b", 0o700),
		fileNode("a/b/three", 0o755, randBytes(22, 40<<10)),
		fileNode("a/b/empty", 0o644, nil),
		dirNode("z-empty", 0o755),
		linkNode("l", "a/one"),
		fileNode("données/模型.bin", 0o644, randBytes(23, 90<<10)),
		fileNode("top", 0o644, []byte("top\n")),
	}
}

// TestDeterminism builds the same tree twice, in opposite creation orders and
// with different mtimes, and checks both pushes give one digest, that the
// second uploads nothing, and that the digest is the same on every target.
func TestDeterminism(t *testing.T) {
	nodes := determinismTree()
	rev := slices.Clone(nodes)
	slices.Reverse(rev)
	base := t.TempDir()
	first, second := filepath.Join(base, "first"), filepath.Join(base, "second")
	buildTree(t, first, nodes, time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC))
	buildTree(t, second, rev, time.Date(2024, 6, 7, 8, 9, 10, 123456789, time.UTC))
	compareTrees(t, first, second)

	digests := map[string]string{}
	forTargets(t, func(t *testing.T, tg target) {
		repo := tg.repo("det/vol")
		a := pushJSON(t, repo+":a", first, smallChunks...)
		if a.BytesUploaded == 0 || a.ChunksUploaded == 0 {
			t.Errorf("first push uploaded nothing: %+v", a)
		}
		if tg.reg != nil {
			tg.reg.ResetStats()
		}
		b := pushJSON(t, repo+":b", second, smallChunks...)
		if a.Digest != b.Digest {
			t.Fatalf("same tree, different digests: %s and %s", a.Digest, b.Digest)
		}
		if b.BytesUploaded != 0 || b.ChunksUploaded != 0 {
			t.Errorf("second push of the same content: bytes_uploaded %d, chunks_uploaded %d, want 0",
				b.BytesUploaded, b.ChunksUploaded)
		}
		if a.Chunks != b.Chunks || a.Bytes != b.Bytes || a.Files != b.Files {
			t.Errorf("pushes of one tree disagree: %+v vs %+v", a, b)
		}
		if tg.reg != nil {
			if st := tg.reg.Stats(); st.BlobBytesIn != 0 {
				t.Errorf("second push sent %d blob bytes to the registry (requests %v)", st.BlobBytesIn, st.Requests)
			}
		}
		// The warm stat cache gives the same answer too.
		if c := pushJSON(t, repo+":c", first, smallChunks...); c.Digest != a.Digest {
			t.Errorf("re-push with a warm stat cache: %s, want %s", c.Digest, a.Digest)
		}
		// Without chunking flags push keeps the chunking of the repository's
		// current version (so it dedups against it): the same version again.
		if d := pushJSON(t, repo+":d", second); d.Digest != a.Digest || d.BytesUploaded != 0 {
			t.Errorf("push without chunking flags to a repository of small-chunked versions: %+v, want digest %s and nothing uploaded", d, a.Digest)
		}
		// Different chunking is a different version.
		if e := pushJSON(t, repo+":e", first, "--chunk-min", "1MiB", "--chunk-avg", "4MiB", "--chunk-max", "8MiB"); e.Digest == a.Digest {
			t.Errorf("1/4/8 MiB chunking gave the digest of 16/64/256 KiB chunking: %s", e.Digest)
		}
		digests[tg.name] = a.Digest
	})
	if len(digests) != 3 {
		t.Fatalf("digests: %v", digests)
	}
	for name, d := range digests {
		if d != digests["oci-layout"] {
			t.Errorf("digest on %s is %s, on the OCI layout %s", name, d, digests["oci-layout"])
		}
	}
}
