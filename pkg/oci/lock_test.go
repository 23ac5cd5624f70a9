package oci

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestLockLayout(t *testing.T) {
	dir := t.TempDir()
	unlock, err := LockLayout(Ref{Layout: dir})
	if err != nil {
		t.Fatal(err)
	}
	tryLock := func() error {
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	if err := tryLock(); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Errorf("a second lock while held: %v; want EWOULDBLOCK", err)
	}
	unlock()
	if err := tryLock(); err != nil {
		t.Errorf("a lock after the release: %v", err)
	}
	if _, err := LockLayout(Ref{Layout: filepath.Join(dir, "missing")}); !errors.Is(err, ErrNotFound) {
		t.Errorf("a missing layout: %v; want ErrNotFound", err)
	}
	unlock, err = LockLayout(Ref{Registry: "r.example", Repository: "a"})
	if err != nil {
		t.Fatal(err)
	}
	unlock()
}
