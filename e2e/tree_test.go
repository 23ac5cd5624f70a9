package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// node is one entry of a tree to build: a file, a directory or a symlink.
type node struct {
	Path   string // slash-separated, relative to the tree's root
	Kind   byte   // 'f', 'd' or 'l'
	Mode   os.FileMode
	Data   []byte
	Target string // symlinks
}

func fileNode(path string, mode os.FileMode, data []byte) node {
	return node{Path: path, Kind: 'f', Mode: mode, Data: data}
}

func dirNode(path string, mode os.FileMode) node {
	return node{Path: path, Kind: 'd', Mode: mode}
}

func linkNode(path, target string) node {
	return node{Path: path, Kind: 'l', Target: target}
}

// randBytes returns n pseudo-random bytes, the same for the same seed.
func randBytes(seed uint64, n int) []byte {
	var key [32]byte
	key[0], key[1] = byte(seed), byte(seed>>8)
	b := make([]byte, n)
	r := rand.NewChaCha8(key)
	_, _ = r.Read(b)
	return b
}

// buildTree creates nodes under root (created if missing) in the given order.
// Missing parent directories are created 0755; permission bits are set with
// chmod so that the umask does not matter. If mtime is non-zero every entry
// but symlinks gets it.
func buildTree(t testing.TB, root string, nodes []node, mtime time.Time) {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	var dirs []node
	for _, n := range nodes {
		p := filepath.Join(root, filepath.FromSlash(n.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		switch n.Kind {
		case 'f':
			if err := os.WriteFile(p, n.Data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, n.Mode); err != nil {
				t.Fatal(err)
			}
		case 'd':
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			dirs = append(dirs, n)
		case 'l':
			if err := os.Symlink(n.Target, p); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("bad node kind %q", n.Kind)
		}
		if !mtime.IsZero() && n.Kind == 'f' {
			if err := os.Chtimes(p, mtime, mtime); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Directories last, deepest first, so a 0500 directory does not stop its
	// children from being written and their writes do not change its mtime.
	sort.SliceStable(dirs, func(i, j int) bool {
		return strings.Count(dirs[i].Path, "/") > strings.Count(dirs[j].Path, "/")
	})
	for _, n := range dirs {
		p := filepath.Join(root, filepath.FromSlash(n.Path))
		if err := os.Chmod(p, n.Mode); err != nil {
			t.Fatal(err)
		}
	}
	if !mtime.IsZero() {
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = os.Chtimes(p, mtime, mtime)
			}
			return nil
		})
	}
}

// entryInfo is what the comparator looks at for one path.
type entryInfo struct {
	Type   string // file, dir, symlink, other
	Perm   os.FileMode
	Size   int64
	SHA    string
	Target string
}

func (e entryInfo) String() string {
	switch e.Type {
	case "file":
		return fmt.Sprintf("file %04o size=%d sha256=%.12s", e.Perm, e.Size, e.SHA)
	case "symlink":
		return fmt.Sprintf("symlink -> %q", e.Target)
	default:
		return fmt.Sprintf("%s %04o", e.Type, e.Perm)
	}
}

// snapshot describes every entry under root (root itself excluded), keyed by
// slash-separated relative path, without following symlinks. Entries under
// any of skip (absolute paths) are left out, as are the skipped paths.
func snapshot(t testing.TB, root string, skip ...string) map[string]entryInfo {
	t.Helper()
	out := map[string]entryInfo{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		if slices.Contains(skip, p) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		e := entryInfo{Perm: info.Mode().Perm()}
		switch {
		case info.Mode().IsRegular():
			e.Type = "file"
			e.Size = info.Size()
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s := sha256.Sum256(b)
			e.SHA = hex.EncodeToString(s[:])
		case info.IsDir():
			e.Type = "dir"
		case info.Mode()&os.ModeSymlink != 0:
			e.Type = "symlink"
			e.Perm = 0
			if e.Target, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			e.Type = "other " + info.Mode().Type().String()
		}
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", root, err)
	}
	return out
}

// diffSnapshots lists how got differs from want, one line per path.
func diffSnapshots(want, got map[string]entryInfo) []string {
	var diffs []string
	for p, w := range want {
		g, ok := got[p]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("missing %q (want %v)", p, w))
		case g != w:
			diffs = append(diffs, fmt.Sprintf("%q: got %v, want %v", p, g, w))
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("unexpected %q (%v)", p, g))
		}
	}
	sort.Strings(diffs)
	return diffs
}

// compareTrees fails the test unless the trees at want and got have the same
// names, types, permission bits, contents, symlink targets and empty dirs.
func compareTrees(t testing.TB, want, got string) {
	t.Helper()
	ws, gs := snapshot(t, want), snapshot(t, got)
	if diffs := diffSnapshots(ws, gs); len(diffs) > 0 {
		t.Fatalf("tree %s differs from %s:\n  %s", got, want, strings.Join(diffs, "\n  "))
	}
	if len(ws) == 0 {
		// Nothing else to compare; make sure both really are empty directories.
		for _, d := range []string{want, got} {
			if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
				t.Fatalf("%s: not a directory (%v)", d, err)
			}
		}
	}
}

// fileContents reads a file or fails the test.
func fileContents(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
