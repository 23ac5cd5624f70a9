package pull

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/push"
)

// fuzzTree builds under root a small tree described by prog (three bytes
// an entry: kind, name and parent, seed) and returns its paths.
func fuzzTree(t *testing.T, root string, prog []byte) []string {
	names := []string{"a", "b", "c", "l"}
	var paths, dirs []string
	seen := map[string]bool{}
	for i := 0; i+2 < len(prog) && len(paths) < 12; i += 3 {
		kind, pick, seed := prog[i]%3, int(prog[i+1]), prog[i+2]
		parent := ""
		if n := pick / len(names) % (len(dirs) + 1); n > 0 {
			parent = dirs[n-1]
		}
		p := path.Join(parent, names[pick%len(names)])
		if seen[p] || parent != "" && len(dirs) > 0 && bytes.Count([]byte(p), []byte("/")) > 2 {
			continue
		}
		full := filepath.Join(root, filepath.FromSlash(p))
		var err error
		switch kind {
		case 0:
			modes := []os.FileMode{0o644, 0o600, 0o755, 0o400}
			err = os.WriteFile(full, testutil.RandBytes(uint64(seed), int(seed)*37%3000), 0o600)
			if err == nil {
				err = os.Chmod(full, modes[seed%4])
			}
		case 1:
			modes := []os.FileMode{0o755, 0o700, 0o750}
			err = os.Mkdir(full, 0o700)
			if err == nil {
				err = os.Chmod(full, modes[seed%3])
				dirs = append(dirs, p)
			}
		case 2:
			targets := []string{"a", "b", "c", "../a", "../../b"}
			target := targets[int(seed)%len(targets)]
			if layout.CheckSymlink(p, target) != nil {
				continue
			}
			err = os.Symlink(target, full)
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[p] = true
		paths = append(paths, p)
	}
	return paths
}

// fuzzPlant plants, per two bytes of plants, a symlink or a hard link to
// something outside, or a directory, at a name the pull will use.
func fuzzPlant(t *testing.T, dst, out string, paths []string, plants []byte) {
	var spots []string
	for _, p := range paths {
		spots = append(spots, p, path.Join(path.Dir(p), oldTmpName(p)), path.Join(pullDirName, tmpName(p)))
	}
	spots = append(spots, pullDirName)
	for i := 0; i+1 < len(plants) && i < 16; i += 2 {
		spot := filepath.Join(dst, filepath.FromSlash(spots[int(plants[i])%len(spots)]))
		if _, err := os.Lstat(spot); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(spot), 0o700); err != nil {
			continue // a planted symlink or file is in the way
		}
		switch plants[i+1] % 6 {
		case 0:
			_ = os.Symlink(filepath.Join(out, "victim"), spot)
		case 1:
			_ = os.Symlink(filepath.Join(out, "dir"), spot)
		case 2:
			_ = os.Link(filepath.Join(out, "victim"), spot)
		case 3:
			// A file with the bytes the pull wants there, linked outside.
			want := filepath.Join(out, "twin-"+filepath.Base(spot))
			_ = os.WriteFile(want, []byte("twin"), 0o640)
			_ = os.Link(want, spot)
		case 4:
			_ = os.Mkdir(spot, 0o700)
		case 5:
			_ = os.Mkdir(spot, 0o777)
			_ = os.Chmod(spot, 0o777)
		}
	}
}

// FuzzPullPlanted seals a tree built from the fuzzer's bytes, plants links
// in the destination, pulls with openat2 and with the stepwise fallback,
// and checks nothing outside the destination changed and, if the pull
// succeeded, that the destination holds the tree.
func FuzzPullPlanted(f *testing.F) {
	f.Add([]byte{0, 0, 5, 1, 1, 1, 0, 4, 9, 2, 3, 0}, []byte{0, 0, 1, 2, 2, 3, 12, 4})
	f.Add([]byte{1, 3, 0, 0, 4, 7, 2, 2, 1}, []byte{0, 1, 1, 0, 2, 4, 3, 2})
	f.Add([]byte{0, 1, 200, 0, 2, 100}, []byte{0, 3, 1, 3, 6, 5})
	f.Fuzz(runPullPlanted)
}

// runPullPlanted is one run of FuzzPullPlanted.
func runPullPlanted(t *testing.T, prog, plants []byte) {
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	paths := fuzzTree(t, src, prog)
	store := memory.New()
	res, err := push.Push(ctx, store, push.DirSource(src), push.Options{Params: layout.Params{Min: 64, Avg: 256, Max: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := layout.Open(ctx, store, res.Root)
	if err != nil {
		t.Fatal(err)
	}
	for _, stepwise := range []bool{false, true} {
		m := pullMode{stepwise: stepwise}
		dst, planted, err := pullPlanted(t, store, v, paths, plants, m)
		if err != nil {
			t.Logf("pull (stepwise=%v) refused: %v", stepwise, err)
			continue
		}
		checkTree(t, dst, store, v.Index, planted, m)
		for _, p := range paths {
			want, _ := os.Lstat(filepath.Join(src, p))
			got, err := os.Lstat(filepath.Join(dst, p))
			if err != nil || got.Mode() != want.Mode() {
				t.Errorf("stepwise=%v: %s: %v, want %v (%v)", stepwise, p, got, want.Mode(), err)
				continue
			}
			switch {
			case want.Mode().IsRegular():
				a, _ := os.ReadFile(filepath.Join(src, p))
				b, _ := os.ReadFile(filepath.Join(dst, p))
				if !bytes.Equal(a, b) || nlink(got) != 1 {
					t.Errorf("stepwise=%v: %s: wrong contents or %d links", stepwise, p, nlink(got))
				}
			case want.Mode()&fs.ModeSymlink != 0:
				a, _ := os.Readlink(filepath.Join(src, p))
				b, _ := os.Readlink(filepath.Join(dst, p))
				if a != b {
					t.Errorf("stepwise=%v: %s: -> %q, want %q", stepwise, p, b, a)
				}
			}
		}
	}
}

// pullMode is how pullPlanted pulls: resolving names with openat2 or one
// element at a time, and with or without checking each file's digest.
type pullMode struct {
	stepwise, verifyFiles bool
}

// pullPlanted pulls v from src into a fresh directory in which plants (see
// fuzzPlant) put links to a directory beside it at the names the pull uses.
// It fails t if anything outside the destination changed, and returns the
// destination, the states of what was in it before the pull (by full path)
// and the pull's error.
func pullPlanted(t *testing.T, src content.Fetcher, v *layout.Version, paths []string, plants []byte, m pullMode) (string, map[string]fileState, error) {
	t.Helper()
	base := t.TempDir()
	dst, out := filepath.Join(base, "dst"), filepath.Join(base, "out")
	for _, d := range []string{dst, filepath.Join(out, "dir")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A volume may make directories this user cannot write; let the
	// removal of base (registered before, so run after) through them.
	t.Cleanup(func() { makeRemovable(dst) })
	if err := os.WriteFile(filepath.Join(out, "victim"), []byte("victim"), 0o644); err != nil {
		t.Fatal(err)
	}
	fuzzPlant(t, dst, out, paths, plants)
	before, planted := states(t, out), states(t, dst)
	d, err := openDest(dst)
	if err != nil {
		t.Fatal(err)
	}
	d.res.Stepwise.Store(m.stepwise)
	_, err = materialise(context.Background(), src, v, d, Options{Jobs: 2, VerifyFiles: m.verifyFiles})
	d.close(err == nil)
	after := states(t, out)
	for p, s := range before {
		if after[p] != s {
			t.Errorf("%+v: outside changed: %s was %+v, is %+v", m, p, s, after[p])
		}
	}
	if len(after) != len(before) {
		t.Errorf("%+v: outside has %d entries, had %d", m, len(after), len(before))
	}
	return dst, planted, err
}

// checkTree checks that dst holds every entry of x with its type, mode and
// contents (regular files with one link, holding their extents' bytes of
// the chunks in src, which with m.verifyFiles have the file's digest), and
// nothing else but what was planted there before the pull.
func checkTree(t *testing.T, dst string, src content.Fetcher, x *layout.Index, planted map[string]fileState, m pullMode) {
	t.Helper()
	chunks := map[int][]byte{}
	want := map[string]bool{}
	for i := range x.Len() {
		f := x.File(i)
		want[f.Path] = true
		full := filepath.Join(dst, filepath.FromSlash(f.Path))
		info, err := os.Lstat(full)
		if err != nil {
			t.Errorf("%q: %v", f.Path, err)
			continue
		}
		switch f.Type {
		case layout.TypeDir:
			if !info.IsDir() || uint32(info.Mode().Perm()) != f.Mode {
				t.Errorf("%q: %v, want a directory of mode %o", f.Path, info.Mode(), f.Mode)
			}
		case layout.TypeSymlink:
			if got, err := os.Readlink(full); err != nil || got != f.Target {
				t.Errorf("%q: -> %q (%v), want a symlink to %q", f.Path, got, err, f.Target)
			}
		case layout.TypeFile:
			if !info.Mode().IsRegular() || uint32(info.Mode().Perm()) != f.Mode || nlink(info) != 1 {
				t.Errorf("%q: %v with %d links, want a regular file of mode %o", f.Path, info.Mode(), nlink(info), f.Mode)
				continue
			}
			var want []byte
			for _, e := range f.Extents {
				if chunks[e.Chunk] == nil {
					b, err := content.FetchAll(context.Background(), src, chunkDescriptor(x.Chunk(e.Chunk)))
					if err != nil {
						t.Fatalf("%q: %v", f.Path, err)
					}
					chunks[e.Chunk] = b
				}
				want = append(want, chunks[e.Chunk][e.Offset:e.Offset+e.Length]...)
			}
			b, err := os.ReadFile(full)
			if err != nil || !bytes.Equal(b, want) {
				t.Errorf("%q: %d bytes %q (%v), want %d bytes %q", f.Path, len(b), b, err, len(want), want)
			}
			if m.verifyFiles && digest.FromBytes(b) != f.Digest {
				t.Errorf("%q: %s, want %s", f.Path, digest.FromBytes(b), f.Digest)
			}
		}
	}
	err := filepath.WalkDir(dst, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dst, p)
		if _, ok := planted[p]; !ok && rel != "." && !want[filepath.ToSlash(rel)] {
			t.Errorf("%q: in the destination but not in the version", rel)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// makeRemovable gives this user write and search permission on every
// directory under root (not following symlinks).
func makeRemovable(root string) {
	info, err := os.Lstat(root)
	if err != nil || !info.IsDir() {
		return
	}
	_ = os.Chmod(root, 0o700)
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		makeRemovable(filepath.Join(root, e.Name()))
	}
}
