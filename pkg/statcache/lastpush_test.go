package statcache

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"
)

// The last push is kept per repository, with the directory made absolute;
// a damaged record reads as none.
func TestLastPush(t *testing.T) {
	dir := t.TempDir()
	if _, ok := LoadLastPush(dir, "reg/a"); ok {
		t.Fatal("a record before any push")
	}
	d := digest.FromString("v1")
	if err := SaveLastPush(dir, "reg/a", "rel/tree", d); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs("rel/tree")
	if l, ok := LoadLastPush(dir, "reg/a"); !ok || l.Dir != abs || l.Digest != d {
		t.Fatalf("got %+v %v, want %s %s", l, ok, abs, d)
	}
	if _, ok := LoadLastPush(dir, "reg/b"); ok {
		t.Fatal("reg/b has reg/a's record")
	}
	if err := os.WriteFile(lastPushPath(dir, "reg/a"), []byte(`{"dir":"/x","digest":"sha256:zz"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if l, ok := LoadLastPush(dir, "reg/a"); ok {
		t.Fatalf("a record with a bad digest read as %+v", l)
	}
}
