package testutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// WriteTree writes files (slash-separated path under root -> bytes) as
// regular files of mode 0644, making their directories.
func WriteTree(t testing.TB, root string, files map[string][]byte) {
	t.Helper()
	for p, data := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// WriteVolumeTree writes files under root as WriteTree does, except that a
// path ending in "@" is a symlink whose target is its bytes.
func WriteVolumeTree(t testing.TB, root string, files map[string][]byte) {
	t.Helper()
	regular := map[string][]byte{}
	for name, data := range files {
		if strings.HasSuffix(name, "@") {
			full := filepath.Join(root, strings.TrimSuffix(name, "@"))
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(string(data), full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		regular[name] = data
	}
	WriteTree(t, root, regular)
}

// SwapTree swaps the directory root/sub for a symlink to outside (a
// directory outside root), as an attacker racing a reader of root would.
func SwapTree(t testing.TB, root, outside string) {
	t.Helper()
	if err := os.Rename(filepath.Join(root, "sub"), filepath.Join(root, "sub.old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "sub")); err != nil {
		t.Fatal(err)
	}
}
