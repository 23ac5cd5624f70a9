package bounded

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestBounded: a file or stream of at most max bytes is read whole; one
// byte more is ErrTooLarge, read no further than max+1 bytes; a FIFO, a
// directory are ErrNotRegular, the FIFO refused without waiting for a
// writer.
func TestBounded(t *testing.T) {
	if b, err := Read(strings.NewReader("12345"), 5); err != nil || string(b) != "12345" {
		t.Fatalf("Read at the bound: %q, %v", b, err)
	}
	r := strings.NewReader(strings.Repeat("x", 100))
	if _, err := Read(r, 5); !errors.Is(err, ErrTooLarge) || r.Len() != 100-6 {
		t.Fatalf("Read past the bound: %v, %d bytes left of 100", err, r.Len())
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, bytes.Repeat([]byte("y"), 10), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFile(p, 10); err != nil || len(b) != 10 {
		t.Fatalf("ReadFile at the bound: %d bytes, %v", len(b), err)
	}
	if _, err := ReadFile(p, 9); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("ReadFile past the bound: %v", err)
	}
	if _, err := ReadFile(dir, 10); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("ReadFile of a directory: %v", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(fifo, 10); !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), "FIFO") {
		t.Fatalf("ReadFile of a FIFO: %v", err)
	}
}
