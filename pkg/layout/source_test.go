package layout

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestDirSourceOpenRefusesSwaps: a file that became a FIFO or a symlink
// after the walk is refused at once, not read (or waited on).
func TestDirSourceOpenRefusesSwaps(t *testing.T) {
	root := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "ok"), []byte("ok"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := DirSource(root)
	for _, name := range []string{"fifo", "link"} {
		done := make(chan error, 1)
		go func() {
			f, err := src.Open(context.Background(), name)
			if err == nil {
				f.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrUnsupportedFile) {
				t.Errorf("open %s: %v, want ErrUnsupportedFile", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("open %s: still blocked after 10s", name)
		}
	}
	f, err := src.Open(context.Background(), "ok")
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2)
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != "ok" {
		t.Errorf("read %q %v", b, err)
	}
	f.Close()
}
