package layout

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"testing"

	"oras.land/oras-go/v2/content/memory"
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
			err = os.WriteFile(full, randBytes(uint64(seed), int(seed)*37%3000), 0o600)
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
			if CheckSymlink(p, target) != nil {
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
// in the destination, pulls, and checks nothing outside the destination
// changed and, if the pull succeeded, that the destination holds the tree.
func FuzzPullPlanted(f *testing.F) {
	f.Add([]byte{0, 0, 5, 1, 1, 1, 0, 4, 9, 2, 3, 0}, []byte{0, 0, 1, 2, 2, 3, 12, 4})
	f.Add([]byte{1, 3, 0, 0, 4, 7, 2, 2, 1}, []byte{0, 1, 1, 0, 2, 4, 3, 2})
	f.Add([]byte{0, 1, 200, 0, 2, 100}, []byte{0, 3, 1, 3, 6, 5})
	f.Fuzz(runPullPlanted)
}

// runPullPlanted is one run of FuzzPullPlanted.
func runPullPlanted(t *testing.T, prog, plants []byte) {
	ctx := context.Background()
	base := t.TempDir()
	src, dst, out := filepath.Join(base, "src"), filepath.Join(base, "dst"), filepath.Join(base, "out")
	for _, d := range []string{src, dst, filepath.Join(out, "dir")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(out, "victim"), []byte("victim"), 0o644); err != nil {
		t.Fatal(err)
	}
	paths := fuzzTree(t, src, prog)
	store := memory.New()
	res, err := Push(ctx, store, DirSource(src), PushOptions{Params: Params{Min: 64, Avg: 256, Max: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := Open(ctx, store, res.Root)
	if err != nil {
		t.Fatal(err)
	}
	fuzzPlant(t, dst, out, paths, plants)
	before := states(t, out)
	_, err = Pull(ctx, store, v, dst, PullOptions{Jobs: 2})
	after := states(t, out)
	for p, s := range before {
		if after[p] != s {
			t.Errorf("outside changed: %s was %+v, is %+v", p, s, after[p])
		}
	}
	if len(after) != len(before) {
		t.Errorf("outside has %d entries, had %d", len(after), len(before))
	}
	if err != nil {
		t.Logf("pull refused: %v", err)
		return
	}
	for _, p := range paths {
		want, _ := os.Lstat(filepath.Join(src, p))
		got, err := os.Lstat(filepath.Join(dst, p))
		if err != nil || got.Mode() != want.Mode() {
			t.Errorf("%s: %v, want %v (%v)", p, got, want.Mode(), err)
			continue
		}
		switch {
		case want.Mode().IsRegular():
			a, _ := os.ReadFile(filepath.Join(src, p))
			b, _ := os.ReadFile(filepath.Join(dst, p))
			if !bytes.Equal(a, b) || nlink(got) != 1 {
				t.Errorf("%s: wrong contents or %d links", p, nlink(got))
			}
		case want.Mode()&fs.ModeSymlink != 0:
			a, _ := os.Readlink(filepath.Join(src, p))
			b, _ := os.Readlink(filepath.Join(dst, p))
			if a != b {
				t.Errorf("%s: -> %q, want %q", p, b, a)
			}
		}
	}
}
