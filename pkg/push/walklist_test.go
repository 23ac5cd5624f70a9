package push

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// TestWalkListRoundTrips: a walk held compactly gives back every field of
// every entry (a directory's stat size, a symlink's target, a stated
// digest), sorted by path, and finds entries by path.
func TestWalkListRoundTrips(t *testing.T) {
	in := []Entry{
		{Path: "b/x.bin", Type: layout.TypeFile, Mode: 0o644, Size: 7, Stat: statcache.Key{Size: 7, Mtime: 5, Ctime: 6, Ino: 9}, Digest: digest.FromString("x")},
		{Path: "a", Type: layout.TypeDir, Mode: 0o755, Stat: statcache.Key{Size: 4096, Mtime: 1, Ctime: 2, Ino: 3}},
		{Path: "b", Type: layout.TypeDir, Mode: 0o700},
		{Path: "a/l", Type: layout.TypeSymlink, Mode: 0o777, Target: "../b/x.bin"},
		{Path: "a.txt", Type: layout.TypeFile, Mode: 0o600, Size: 1 << 40},
	}
	w, err := newWalkList(in)
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{in[1], in[4], in[3], in[2], in[0]} // "a" < "a.txt" < "a/l" < "b" < "b/x.bin"
	if got := w.entries(); !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, want)
	}
	for i, e := range want {
		if w.find(e.Path) != i || w.kind(i) != e.Type || w.path(i) != e.Path {
			t.Fatalf("entry %d (%s): find %d, kind %s", i, e.Path, w.find(e.Path), w.kind(i))
		}
	}
	if w.find("a/") != -1 || w.find("c") != -1 || w.find("") != -1 {
		t.Fatal("found a path the walk does not hold")
	}
	if _, err := newWalkList([]Entry{{Path: "x", Type: "fifo"}}); err == nil {
		t.Fatal("an entry of unknown type was held")
	}
}

// TestWalkStatsFilesAsLstat: Walk stats regular files many at once after
// listing them; each file's mode, size and stat key are those lstat gives,
// a directory's and a symlink's too, in path order.
func TestWalkStatsFilesAsLstat(t *testing.T) {
	root := t.TempDir()
	for i := range 5000 {
		p := filepath.Join(root, fmt.Sprintf("d%d", i%7), fmt.Sprintf("f%04d", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, i%300), os.FileMode(0o600|(i%2)*0o44)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("d1/f0001", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	es, err := Walk(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 5000+7+1 {
		t.Fatalf("%d entries", len(es))
	}
	for i, e := range es {
		if i > 0 && es[i-1].Path >= e.Path {
			t.Fatalf("%q after %q", e.Path, es[i-1].Path)
		}
		info, err := os.Lstat(filepath.Join(root, e.Path))
		if err != nil {
			t.Fatal(err)
		}
		want := Entry{Path: e.Path, Mode: uint32(info.Mode().Perm()), Stat: statcache.KeyOf(info)}
		switch {
		case info.Mode().IsRegular():
			want.Type, want.Size = layout.TypeFile, info.Size()
		case info.IsDir():
			want.Type = layout.TypeDir
		default:
			want.Type, want.Mode, want.Target = layout.TypeSymlink, 0o777, "d1/f0001"
		}
		if !reflect.DeepEqual(e, want) {
			t.Fatalf("entry %d:\n got %+v\nwant %+v", i, e, want)
		}
	}
}
