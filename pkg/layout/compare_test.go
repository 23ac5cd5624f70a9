package layout

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

// TestCompareDir: a freshly pulled directory matches its version; each kind
// of change is listed once, and the pull's own names are not.
func TestCompareDir(t *testing.T) {
	ctx := context.Background()
	files := map[string][]byte{
		"a":       testutil.RandBytes(1, 70<<10),
		"d/b":     []byte("bbbb"),
		"d/c":     []byte("cccc"),
		"d/e/f":   []byte("f"),
		"d/e/g":   []byte("g"),
		"m":       []byte("mode"),
		"s@":      []byte("a"),
		"gone":    []byte("gone"),
		"resized": []byte("resized"),
	}
	_, v := pushed(t, Params{Min: 8 << 10, Avg: 32 << 10, Max: 64 << 10}, files)
	dst := t.TempDir()
	testutil.WriteVolumeTree(t, dst, files) // as a pull leaves it
	diffs, err := CompareDir(ctx, v, dst, nil)
	if err != nil || len(diffs) != 0 {
		t.Fatalf("fresh pull: %v, %v", diffs, err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dst, "d/b"), []byte("BBBB"), 0o644)) // same size, other bytes
	must(os.Chmod(filepath.Join(dst, "m"), 0o600))
	must(os.Remove(filepath.Join(dst, "gone")))
	must(os.RemoveAll(filepath.Join(dst, "d/e")))
	must(os.WriteFile(filepath.Join(dst, "resized"), []byte("longer now"), 0o644))
	must(os.WriteFile(filepath.Join(dst, "extra"), nil, 0o644))
	must(os.Remove(filepath.Join(dst, "s")))
	must(os.Symlink("elsewhere", filepath.Join(dst, "s")))
	must(os.Mkdir(filepath.Join(dst, ReservedPrefix+"pull"), 0o700))
	diffs, err = CompareDir(ctx, v, dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range diffs {
		got = append(got, d.Path+" "+d.Kind)
	}
	slices.Sort(got)
	want := []string{"d/b digest", "d/e missing", "extra extra", "gone missing", "m mode", "resized size", "s target"}
	if !slices.Equal(got, want) {
		t.Errorf("differences %q, want %q", got, want)
	}
}

// TestCompareDirRefusesSwappedDir: a directory swapped for a symlink to an
// outside directory after CompareDir found it a directory is not read
// through: CompareDir fails naming it, and neither compares nor lists what
// the outside directory holds.
func TestCompareDirRefusesSwappedDir(t *testing.T) {
	ctx := context.Background()
	files := map[string][]byte{"sub/f": []byte("inside-bytes")}
	_, v := pushed(t, Params{Min: 8 << 10, Avg: 32 << 10, Max: 64 << 10}, files)
	base := t.TempDir()
	dst, outside := filepath.Join(base, "dst"), filepath.Join(base, "outside")
	testutil.WriteVolumeTree(t, dst, files) // as a pull leaves it
	testutil.WriteTree(t, outside, map[string][]byte{"f": []byte("secret-bytes"), "secret-name": nil})
	compareHook = func(p string) {
		if p == "sub" {
			testutil.SwapTree(t, dst, outside)
		}
	}
	defer func() { compareHook = nil }()
	diffs, err := CompareDir(ctx, v, dst, nil)
	if !errors.Is(err, ErrUnsupportedFile) || !strings.Contains(err.Error(), filepath.Join(dst, "sub")) {
		t.Errorf("verify: %v, want ErrUnsupportedFile naming sub", err)
	}
	if len(diffs) != 0 {
		t.Errorf("differences reported from the outside directory: %v", diffs)
	}
}
