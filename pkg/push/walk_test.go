package push

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

// TestWalkSkipsReservedNames: what an interrupted pull left is not pushed.
func TestWalkSkipsReservedNames(t *testing.T) {
	root := t.TempDir()
	testutil.WriteTree(t, root, map[string][]byte{"a": []byte("a"), ".bdnvol-pull/0123.part": []byte("partial"), "d/.bdnvol-x.part": nil})
	es, err := Walk(root)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Path)
	}
	if strings.Join(got, ",") != "a,d" {
		t.Fatalf("walked %q", got)
	}
}

// TestWalkFollowsRootSymlink: a root given as a symlink to a directory is
// that directory (symlinks inside are still not followed).
func TestWalkFollowsRootSymlink(t *testing.T) {
	base := t.TempDir()
	testutil.WriteTree(t, filepath.Join(base, "real"), map[string][]byte{"a": []byte("a"), "d/b": []byte("b")})
	if err := os.Symlink("real", filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("d", filepath.Join(base, "real", "dl")); err != nil {
		t.Fatal(err)
	}
	es, err := Walk(filepath.Join(base, "link"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Path+":"+e.Type)
	}
	if strings.Join(got, ",") != "a:file,d:dir,d/b:file,dl:symlink" {
		t.Fatalf("walked %q", got)
	}
}
