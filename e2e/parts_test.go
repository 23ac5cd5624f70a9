package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

var tinyChunks = []string{"--chunk-min", "4KiB", "--chunk-avg", "8KiB", "--chunk-max", "16KiB", "--max-layers", "50"}

// TestIndexOfParts pushes a volume with more chunks than --max-layers, so its
// root must be an OCI image index of part manifests, and pulls it back.
func TestIndexOfParts(t *testing.T) {
	forTargets(t, func(t *testing.T, tg target) {
		var nodes []node
		for i := range 4 {
			nodes = append(nodes, fileNode(fmt.Sprintf("data/part-%d.bin", i), 0o644, randBytes(uint64(30+i), 512<<10)))
		}
		nodes = append(nodes,
			fileNode("small", 0o600, []byte("small")),
			dirNode("empty", 0o755),
			linkNode("data/link", "part-0.bin"),
		)
		src := filepath.Join(t.TempDir(), "src")
		buildTree(t, src, nodes, time.Time{})
		name := "vols/parts"
		repo := tg.repo(name)

		pr := pushJSON(t, repo+":v1", src, tinyChunks...)
		if pr.Chunks <= 50 {
			t.Fatalf("premise: want more than 50 chunks, got %+v", pr)
		}

		var m ociManifest
		if tg.reg != nil {
			body, ct := getManifest(t, tg.reg, name, pr.Digest, mtIndex)
			if ct != mtIndex {
				t.Errorf("Content-Type of the root = %q, want %q", ct, mtIndex)
			}
			if digestOf(body) != pr.Digest {
				t.Errorf("root body has digest %s, push said %s", digestOf(body), pr.Digest)
			}
			mustJSON(t, body, &m)
		} else {
			mustJSON(t, fetchManifest(t, tg, name, pr.Digest), &m)
		}
		if m.MediaType != mtIndex || m.ArtifactType != mtVolume {
			t.Fatalf("root: mediaType %q artifactType %q, want %q and %q", m.MediaType, m.ArtifactType, mtIndex, mtVolume)
		}
		if len(m.Manifests) < 2 {
			t.Errorf("root index has %d part manifests, want at least 2 for %d chunks", len(m.Manifests), pr.Chunks)
		}
		for _, d := range m.Manifests {
			var part ociManifest
			mustJSON(t, fetchManifest(t, tg, name, d.Digest), &part)
			if part.MediaType != mtManifest || d.MediaType != mtManifest {
				t.Errorf("part %s: mediaType %q (descriptor %q)", d.Digest, part.MediaType, d.MediaType)
			}
			chunks := 0
			for _, l := range part.Layers {
				if l.MediaType == mtChunk {
					chunks++
				}
			}
			if chunks > 50 {
				t.Errorf("part %s holds %d chunks, --max-layers is 50", d.Digest, chunks)
			}
		}

		for _, ref := range []string{repo + ":v1", repo + "@" + pr.Digest} {
			dst := filepath.Join(t.TempDir(), "dst")
			pull(t, ref, dst)
			compareTrees(t, src, dst)
		}
	})
}
