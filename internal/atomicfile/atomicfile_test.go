package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFileReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	for _, want := range []string{"first", "second, longer"} {
		if err := WriteFile(p, []byte(want), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != want {
			t.Fatalf("read %q, %v; want %q", got, err, want)
		}
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, %v; want 0640", st.Mode(), err)
	}
	names, _ := os.ReadDir(dir)
	if len(names) != 1 {
		t.Errorf("directory holds %d entries, want only the file (no temporaries)", len(names))
	}
}

func TestWriteFileFailureKeepsTheOldFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory where the file should go: the rename fails.
	target := filepath.Join(dir, "d")
	if err := os.MkdirAll(filepath.Join(target, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(target, []byte("new"), 0o644); err == nil {
		t.Fatal("replacing a non-empty directory succeeded")
	}
	if err := WriteFile(filepath.Join(dir, "missing", "f"), []byte("new"), 0o644); err == nil {
		t.Fatal("writing into a missing directory succeeded")
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("the other file changed: %q", b)
	}
	names, _ := os.ReadDir(dir)
	if len(names) != 2 {
		t.Errorf("directory holds %d entries, want 2 (a temporary was left)", len(names))
	}
}
