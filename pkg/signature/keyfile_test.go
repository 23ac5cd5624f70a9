package signature

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// within runs f and fails the test if it does not return in 5 seconds
// (a FIFO's open blocks until a writer comes).
func within[T any](t *testing.T, what string, f func() (T, error)) (T, error) {
	t.Helper()
	type res struct {
		v   T
		err error
	}
	ch := make(chan res, 1)
	go func() { v, err := f(); ch <- res{v, err} }()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: did not return in 5s", what)
	}
	panic("unreachable")
}

// hostileKeyDir makes a directory holding a FIFO, a directory and a
// file larger than a key file may be, each named like a key, and a key.
func hostileKeyDir(t *testing.T) (dir string, names []string, pub string) {
	t.Helper()
	dir = t.TempDir()
	fifo := filepath.Join(dir, "fifo.pub")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	// Unblock a reader stuck in open on the FIFO (the code before the fix).
	t.Cleanup(func() {
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	if err := os.Mkdir(filepath.Join(dir, "dir.pub"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, pub = newKey(t, dir, "good")
	big := append(mustReadFile(t, pub), make([]byte, maxKeyFile)...)
	if err := os.WriteFile(filepath.Join(dir, "big.pub"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, []string{"fifo.pub", "dir.pub", "big.pub"}, pub
}

func mustReadFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestLoadKeyRefusesNonRegular: a key file the CLI is given that is a
// FIFO, a directory or too big is refused at once.
func TestLoadKeyRefusesNonRegular(t *testing.T) {
	dir, names, pub := hostileKeyDir(t)
	for _, name := range names {
		p := filepath.Join(dir, name)
		if _, err := within(t, "LoadPublicKey "+name, func() (Verifier, error) { return LoadPublicKey(p, nil) }); !errors.Is(err, ErrKey) {
			t.Errorf("LoadPublicKey %s: %v; want %v", name, err, ErrKey)
		}
		if _, err := within(t, "LoadPrivateKey "+name, func() (Signer, error) {
			return LoadPrivateKey(p, func() ([]byte, error) { return []byte("pw"), nil })
		}); !errors.Is(err, ErrKey) {
			t.Errorf("LoadPrivateKey %s: %v; want %v", name, err, ErrKey)
		}
	}
	if _, err := LoadPolicy(pub); err != nil {
		t.Fatal(err)
	}
}

// TestPolicyFromValueKeyDir: the volume attribute's key file is read only
// beneath the key directory, and every refusal, whatever the path names
// (nothing, a FIFO, a directory, a big file, a file that is no key, a
// path out of the directory), is the same message.
func TestPolicyFromValueKeyDir(t *testing.T) {
	dir, names, pub := hostileKeyDir(t)
	outside := t.TempDir()
	_, outPub := newKey(t, outside, "outside")
	if err := os.WriteFile(filepath.Join(dir, "text.pub"), []byte("not a key\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outPub, filepath.Join(dir, "link.pub")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("good.pub", filepath.Join(dir, "inner.pub")); err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{"good.pub", pub, "inner.pub", "./good.pub"} {
		if p, err := PolicyFromValue(ok, dir); err != nil || !p.Required() {
			t.Errorf("%s: %v", ok, err)
		}
	}
	refused := append(names, "text.pub", "missing.pub", "link.pub", outPub, "../"+filepath.Base(outside)+"/outside.pub",
		filepath.Join(dir, "..", filepath.Base(outside), "outside.pub"), "/etc/passwd", "/proc/self/mem", "/dev/zero", "")
	var msg string
	for _, name := range refused {
		if name == "" {
			name = filepath.Join(dir, "fifo.pub") // absolute, beneath the directory
		}
		_, err := within(t, "PolicyFromValue "+name, func() (Policy, error) { return PolicyFromValue(name, dir) })
		if !errors.Is(err, ErrKeyName) || !errors.Is(err, ErrKey) {
			t.Errorf("%s: %v; want %v", name, err, ErrKeyName)
			continue
		}
		if msg == "" {
			msg = err.Error()
		}
		if err.Error() != msg || strings.Contains(err.Error(), name) {
			t.Errorf("%s: refused with %q; want the one message %q", name, err, msg)
		}
	}
	for _, name := range []string{"good.pub", pub, "fifo.pub", "missing.pub"} {
		if _, err := PolicyFromValue(name, ""); err == nil || err.Error() != msg {
			t.Errorf("%s without a key directory: %v; want %q", name, err, msg)
		}
	}
}
