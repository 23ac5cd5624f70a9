package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// richTree has every kind of entry a volume must restore bit-exact.
func richTree() []node {
	big := randBytes(10, 3<<20) // larger than --chunk-max 256KiB
	shared := randBytes(11, 300<<10)
	return []node{
		fileNode("readme.txt", 0o644, []byte("hello, volume\n")),
		fileNode("empty.txt", 0o644, nil),
		dirNode("bin", 0o755),
		fileNode("bin/run.sh", 0o755, []byte("#!/bin/sh\necho hi\n")),
		linkNode("bin/readme", "../readme.txt"),
		dirNode("private", 0o700),
		fileNode("private/key", 0o600, []byte("secret")),
		dirNode("private/empty", 0o700),
		dirNode("emptydir", 0o755),
		dirNode("nested/deep/er", 0o755),
		fileNode("nested/deep/er/leaf", 0o644, randBytes(12, 5000)),
		linkNode("link-to-dir", "nested/deep"),
		linkNode("link-to-file", "readme.txt"),
		dirNode("données", 0o755),
		fileNode("données/模型.bin", 0o644, randBytes(13, 70<<10)),
		fileNode("space name (1).txt", 0o600, []byte("spaces")),
		fileNode("big.bin", 0o644, big),
		fileNode("copies/a.bin", 0o644, shared),
		fileNode("copies/b.bin", 0o755, shared),
	}
}

func TestRoundTrip(t *testing.T) {
	forTargets(t, func(t *testing.T, tg target) {
		src := filepath.Join(t.TempDir(), "src")
		buildTree(t, src, richTree(), time.Time{})
		repo := tg.repo("vols/rich")

		d := push(t, repo, repo+":v1", src, append([]string{"--tag", "extra", "--tag", "other"}, smallChunks...)...)
		m, idx := checkRoot(t, tg, "vols/rich", d)
		t.Logf("root %s: %s with %d layers / %d manifests", d, m.MediaType, len(m.Layers), len(m.Manifests))
		if idx != nil {
			// Every entry of the tree is in the index, with its type and mode.
			want := snapshot(t, src)
			if len(idx.Files) != len(want) {
				t.Errorf("index has %d entries, tree %d", len(idx.Files), len(want))
			}
			for _, f := range idx.Files {
				if f.Path == "big.bin" && len(f.Extents) < 12 {
					t.Errorf("big.bin (3 MiB) in %d extents, want at least 12 with --chunk-max 256KiB", len(f.Extents))
				}
				w, ok := want[f.Path]
				if !ok {
					t.Errorf("index entry %q not in the tree", f.Path)
					continue
				}
				if f.Type != w.Type || (f.Type != "symlink" && os.FileMode(f.Mode) != w.Perm) || f.Target != w.Target ||
					(f.Type == "file" && (f.Size != w.Size || f.Digest != "sha256:"+w.SHA)) {
					t.Errorf("index entry %+v, tree has %v", f, w)
				}
			}
		}

		for _, ref := range []string{
			repo + ":v1",
			repo + "@" + d,
			repo + ":v1@" + d,
			repo + ":extra",
			repo + ":other",
		} {
			t.Run(strings.TrimPrefix(ref, repo), func(t *testing.T) {
				dst := filepath.Join(t.TempDir(), "dst")
				pull(t, ref, dst)
				compareTrees(t, src, dst)
			})
		}

		t.Run("into existing empty dir", func(t *testing.T) {
			dst := t.TempDir()
			res := pull(t, repo+"@"+d, dst, "--json")
			var obj map[string]any
			if err := json.Unmarshal([]byte(strings.TrimSpace(res.stdout)), &obj); err != nil {
				t.Errorf("pull --json: stdout is not one JSON object: %v\n%s", err, res)
			}
			compareTrees(t, src, dst)
		})

		t.Run("json", func(t *testing.T) {
			pr := pushJSON(t, repo+":v2", src, smallChunks...)
			if pr.Digest != d {
				t.Errorf("second push of the same tree: digest %s, first %s", pr.Digest, d)
			}
			var files, size int64
			for _, e := range snapshot(t, src) {
				if e.Type == "file" {
					files++
					size += e.Size
				}
			}
			if pr.Bytes != size {
				t.Errorf("bytes = %d, the tree's files hold %d", pr.Bytes, size)
			}
			if pr.Chunks < 2 || pr.ChunksUploaded != 0 || pr.BytesUploaded != 0 {
				t.Errorf("re-push of an unchanged tree: %+v", pr)
			}
			if !strings.HasPrefix(pr.Reference, repo) {
				t.Errorf("reference = %q, want it to start with %q", pr.Reference, repo)
			}
		})

		t.Run("DIR defaults to .", func(t *testing.T) {
			args := append([]string{"push"}, smallChunks...)
			res := runIn(t, src, append(args, repo+":cwd")...)
			if res.code != 0 || res.lastLine() != repo+"@"+d {
				t.Errorf("push from the working directory: want last line %s@%s\n%s", repo, d, res)
			}
		})
	})
}

func TestEmptyVolume(t *testing.T) {
	forTargets(t, func(t *testing.T, tg target) {
		src := t.TempDir()
		repo := tg.repo("vols/empty")
		pr := pushJSON(t, repo+":empty", src)
		if pr.Files != 0 || pr.Bytes != 0 {
			t.Errorf("empty volume: %+v", pr)
		}
		_, idx := checkRoot(t, tg, "vols/empty", pr.Digest)
		if idx != nil && len(idx.Files) != 0 {
			t.Errorf("empty volume lists files: %+v", idx.Files)
		}
		for _, ref := range []string{repo + ":empty", repo + "@" + pr.Digest} {
			dst := filepath.Join(t.TempDir(), "dst")
			pull(t, ref, dst)
			compareTrees(t, src, dst)
		}
	})
}
