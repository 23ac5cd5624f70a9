package layout

import (
	"reflect"
	"testing"

	"github.com/opencontainers/go-digest"
)

// TestWalkListRoundTrips: a walk held compactly gives back every field of
// every entry (a directory's stat size, a symlink's target, a stated
// digest), sorted by path, and finds entries by path.
func TestWalkListRoundTrips(t *testing.T) {
	in := []Entry{
		{Path: "b/x.bin", Type: TypeFile, Mode: 0o644, Size: 7, Stat: StatKey{Size: 7, Mtime: 5, Ctime: 6, Ino: 9}, Digest: digest.FromString("x")},
		{Path: "a", Type: TypeDir, Mode: 0o755, Stat: StatKey{Size: 4096, Mtime: 1, Ctime: 2, Ino: 3}},
		{Path: "b", Type: TypeDir, Mode: 0o700},
		{Path: "a/l", Type: TypeSymlink, Mode: 0o777, Target: "../b/x.bin"},
		{Path: "a.txt", Type: TypeFile, Mode: 0o600, Size: 1 << 40},
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
