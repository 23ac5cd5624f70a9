package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pullSite is a place to pull into: DIR is base/x/y/dest, with siblings and
// an "outside" directory around it that a pull must never touch.
type pullSite struct {
	base, dst, outside string
	before             map[string]entryInfo
}

func newPullSite(t *testing.T) *pullSite {
	t.Helper()
	base := t.TempDir()
	s := &pullSite{
		base:    base,
		dst:     filepath.Join(base, "x", "y", "dest"),
		outside: filepath.Join(base, "x", "outside"),
	}
	buildTree(t, base, []node{
		fileNode("x/sentinel", 0o644, []byte("x")),
		fileNode("x/y/sentinel", 0o644, []byte("y")),
		dirNode("x/outside", 0o755),
		fileNode("x/outside/keep", 0o644, []byte("keep")),
	}, time.Time{})
	s.before = snapshot(t, base, s.dst)
	return s
}

// checkFailedPull checks what a pull that must fail did: exit code 1, one
// line on stderr naming the reference (and mention, if given), nothing
// changed outside DIR, no symlink under DIR that leads out of it, and no file
// under DIR whose contents differ from what good says that path should hold
// (path -> sha256 hex). It returns stderr.
func (s *pullSite) checkFailedPull(t *testing.T, res result, name string, mentions []string, good map[string]string) string {
	t.Helper()
	if res.code == 0 {
		t.Errorf("pull succeeded, want it to fail:\n%s", res)
	} else if res.code != 1 {
		t.Errorf("exit code %d, want 1 (runtime error):\n%s", res.code, res)
	}
	line := oneLine(t, res)
	t.Logf("stderr: %s", line)
	if !strings.Contains(line, name) {
		t.Errorf("stderr does not name the reference (%s): %q", name, line)
	}
	if len(mentions) > 0 {
		found := false
		for _, m := range mentions {
			found = found || strings.Contains(line, m)
		}
		if !found {
			t.Errorf("stderr names none of %q: %q", mentions, line)
		}
	}
	if diffs := diffSnapshots(s.before, snapshot(t, s.base, s.dst)); len(diffs) > 0 {
		t.Errorf("pull changed things outside DIR:\n  %s", strings.Join(diffs, "\n  "))
	}
	if _, err := os.Lstat(s.dst); err != nil {
		return line // nothing written at all
	}
	for p, e := range snapshot(t, s.dst) {
		full := filepath.Join(s.dst, filepath.FromSlash(p))
		switch e.Type {
		case "symlink":
			if escapes(s.dst, full, e.Target) {
				t.Errorf("pull left a symlink leading out of DIR: %s -> %s", p, e.Target)
			}
		case "file":
			want, ok := good[p]
			if ok && want != e.SHA {
				t.Errorf("pull left %q with wrong contents (sha256 %.12s, want %.12s)", p, e.SHA, want)
			}
			if !ok {
				t.Logf("failed pull left %q (%v)", p, e)
			}
		}
	}
	return line
}

// escapes tells whether the symlink at link (under root) leads out of root,
// read lexically or once resolved.
func escapes(root, link, target string) bool {
	if filepath.IsAbs(target) || outside(root, filepath.Join(filepath.Dir(link), target)) {
		return true
	}
	real, err := filepath.EvalSymlinks(link)
	if err != nil {
		return false // dangling: the lexical check above is all there is
	}
	rootReal, err := filepath.EvalSymlinks(root)
	return err == nil && outside(rootReal, real)
}

// outside tells whether path p is outside directory root.
func outside(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err != nil || rel == ".." || strings.HasPrefix(rel, "../")
}

// goodContents maps the paths of an index's files to the sha256 hex their
// contents must have.
func goodContents(idx fileIndex) map[string]string {
	m := map[string]string{}
	for _, f := range idx.Files {
		if f.Type == "file" {
			m[f.Path] = strings.TrimPrefix(f.Digest, "sha256:")
		}
	}
	return m
}

type hostileCase struct {
	name     string
	build    func(s *pullSite) (fileIndex, [][]byte)
	mentions []string           // stderr must contain one of these, if any
	manifest func(*ociManifest) // changes the root manifest, if set
}

func hostileCases() []hostileCase {
	evil := []byte("evil\n")
	other := []byte("other\n")
	link := func(p, target string) indexEntry {
		return indexEntry{Path: p, Type: "symlink", Mode: 0o777, Target: target}
	}
	dir := func(p string) indexEntry { return indexEntry{Path: p, Type: "dir", Mode: 0o755} }
	one := func(entries ...indexEntry) func(*pullSite) (fileIndex, [][]byte) {
		return func(*pullSite) (fileIndex, [][]byte) {
			return fileIndex{Files: entries}, [][]byte{evil}
		}
	}
	return []hostileCase{
		{"dotdot", one(fileEntry("../evil", 0o644, evil, 0)), []string{"../evil"}, nil},
		{"dotdot-inner", one(dir("a"), fileEntry("a/../../evil", 0o644, evil, 0)), []string{"a/../../evil"}, nil},
		{"absolute-path", func(s *pullSite) (fileIndex, [][]byte) {
			p := filepath.Join(s.base, "x", "abs-evil")
			return fileIndex{Files: []indexEntry{fileEntry(p, 0o644, evil, 0)}}, [][]byte{evil}
		}, nil, nil},
		{"symlink-dotdot", one(link("link", "../../outside")), []string{"link"}, nil},
		{"symlink-absolute", func(s *pullSite) (fileIndex, [][]byte) {
			return fileIndex{Files: []indexEntry{link("link", s.outside)}}, [][]byte{evil}
		}, []string{"link"}, nil},
		{"symlink-dotdot-then-write", one(link("link", "../../outside"), fileEntry("link/pwned", 0o644, evil, 0)), []string{"link"}, nil},
		{"duplicate-file", func(*pullSite) (fileIndex, [][]byte) {
			return fileIndex{Files: []indexEntry{fileEntry("a", 0o644, evil, 0), fileEntry("a", 0o644, other, 1)}},
				[][]byte{evil, other}
		}, []string{"a"}, nil},
		{"duplicate-dir-file", one(dir("a"), fileEntry("a", 0o644, evil, 0)), []string{"a"}, nil},
		{"file-under-symlink", one(link("link", "sub"), fileEntry("link/x", 0o644, evil, 0), dir("sub")), []string{"link"}, nil},
		// d/l -> .. and d/l/l2 -> .. each stay inside DIR read lexically, but
		// followed they lead to DIR/l2 -> .. and so DIR/../evil.
		{"symlink-chain", one(dir("d"), link("d/l", ".."), link("d/l/l2", ".."), fileEntry("d/l/l2/evil", 0o644, evil, 0)), []string{"d/l"}, nil},
		{"file-digest-mismatch", func(*pullSite) (fileIndex, [][]byte) {
			e := fileEntry("f", 0o644, evil, 0)
			e.Digest = digestOf(other)
			return fileIndex{Files: []indexEntry{e}}, [][]byte{evil}
		}, []string{"f"}, nil},
		{"extent-past-chunk", func(*pullSite) (fileIndex, [][]byte) {
			data := append(append([]byte{}, evil...), make([]byte, 100)...)
			e := fileEntry("f", 0o644, data, 0)
			return fileIndex{Files: []indexEntry{e}}, [][]byte{evil}
		}, []string{"f"}, nil},
		{"extent-bad-chunk-index", func(*pullSite) (fileIndex, [][]byte) {
			return fileIndex{Files: []indexEntry{fileEntry("f", 0o644, evil, 7)}}, [][]byte{evil}
		}, []string{"f"}, nil},
		// The manifest's chunk layers are not the index's chunks, in order:
		// each file would be filled from the other one's chunk.
		{name: "layers-out-of-order", build: func(*pullSite) (fileIndex, [][]byte) {
			return fileIndex{Files: []indexEntry{fileEntry("a", 0o644, evil, 0), fileEntry("b", 0o644, other, 1)}},
				[][]byte{evil, other}
		}, manifest: func(m *ociManifest) { m.Layers[1], m.Layers[2] = m.Layers[2], m.Layers[1] }},
		{name: "chunk-layer-missing", build: func(*pullSite) (fileIndex, [][]byte) {
			return fileIndex{Files: []indexEntry{fileEntry("a", 0o644, evil, 0), fileEntry("b", 0o644, other, 1)}},
				[][]byte{evil, other}
		}, manifest: func(m *ociManifest) { m.Layers = m.Layers[:2] }},
		{name: "not-a-volume", build: func(*pullSite) (fileIndex, [][]byte) {
			return fileIndex{Files: []indexEntry{fileEntry("a", 0o644, evil, 0)}}, [][]byte{evil}
		}, manifest: func(m *ociManifest) { m.ArtifactType = "application/vnd.example.other.v1" }},
	}
}

// TestHostileVersions pulls hand-crafted malicious versions from each target.
func TestHostileVersions(t *testing.T) {
	forTargets(t, func(t *testing.T, tg target) {
		for _, c := range hostileCases() {
			t.Run(c.name, func(t *testing.T) {
				s := newPullSite(t)
				idx, chunks := c.build(s)
				v := craftWith(t, idx, chunks, c.manifest)
				name := "hostile/" + c.name
				if tg.reg != nil {
					pushVersion(t, tg.reg, name, "v1", v)
				} else {
					writeLayout(t, filepath.Join(tg.root, name), "v1", v)
				}
				res := run(t, "pull", tg.repo(name)+":v1", s.dst)
				s.checkFailedPull(t, res, name, c.mentions, goodContents(v.index))
			})
		}
	})
}

// TestCorruptBlobs pushes a valid version, then has the target serve a
// corrupted chunk (or file index) and checks the pull refuses it.
func TestCorruptBlobs(t *testing.T) {
	forTargets(t, func(t *testing.T, tg target) {
		var nodes []node
		for i := range 6 {
			nodes = append(nodes, fileNode("d/f"+string(rune('0'+i)), 0o644, randBytes(uint64(40+i), 100<<10)))
		}
		nodes = append(nodes, fileNode("small", 0o644, []byte("small")))
		src := filepath.Join(t.TempDir(), "src")
		buildTree(t, src, nodes, time.Time{})
		name := "vols/corrupt"
		pr := pushJSON(t, tg.repo(name)+":v1", src, smallChunks...)
		_, idx := checkRoot(t, tg, name, pr.Digest)
		if idx == nil {
			t.Fatalf("premise: a single-manifest version, got an index")
		}
		if len(idx.Chunks) < 3 {
			t.Fatalf("premise: several chunks, got %d", len(idx.Chunks))
		}
		var m ociManifest
		mustJSON(t, fetchManifest(t, tg, name, pr.Digest), &m)
		good := map[string]string{}
		for p, e := range snapshot(t, src) {
			if e.Type == "file" {
				good[p] = e.SHA
			}
		}

		// corrupt makes the target serve digest with a flipped byte and
		// returns a function that repairs it.
		corrupt := func(t *testing.T, digest string) (repair func()) {
			if tg.reg != nil {
				tg.reg.Corrupt(digest)
				return func() { tg.reg.Uncorrupt(digest) }
			}
			p := filepath.Join(tg.root, name, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
			b := fileContents(t, p)
			b[len(b)/2] ^= 0xff
			_ = os.Chmod(p, 0o644)
			mustWrite(t, p, b)
			return func() {
				b[len(b)/2] ^= 0xff
				mustWrite(t, p, b)
			}
		}

		ci := len(idx.Chunks) / 2
		chunk := idx.Chunks[ci].Digest
		mentions := []string{strings.TrimPrefix(chunk, "sha256:")[:12]}
		for _, f := range idx.Files {
			for _, e := range f.Extents {
				if e[0] == int64(ci) {
					mentions = append(mentions, f.Path)
				}
			}
		}
		t.Run("chunk", func(t *testing.T) {
			repair := corrupt(t, chunk)
			s := newPullSite(t)
			res := run(t, "pull", tg.repo(name)+":v1", s.dst)
			s.checkFailedPull(t, res, name, mentions, good)

			// Once the target serves the right bytes, a pull into the same
			// DIR (over whatever the failed one left) is bit-exact.
			repair()
			pull(t, tg.repo(name)+":v1", s.dst)
			compareTrees(t, src, s.dst)
		})
		t.Run("file-index", func(t *testing.T) {
			repair := corrupt(t, m.Layers[0].Digest)
			defer repair()
			s := newPullSite(t)
			res := run(t, "pull", tg.repo(name)+"@"+pr.Digest, s.dst)
			s.checkFailedPull(t, res, name, nil, good)
		})
	})
}
