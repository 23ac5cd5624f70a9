package oci

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

func TestOpenLockedHoldsTheLayoutLockUntilReleased(t *testing.T) {
	ctx := context.Background()
	ref := Ref{Layout: filepath.Join(t.TempDir(), "vol")}
	if _, _, err := OpenLocked(ctx, ref, Options{}, true); err == nil {
		t.Fatal("OpenLocked of a missing layout succeeded")
	}
	if _, err := Open(ctx, ref, Options{CreateLayout: true}); err != nil {
		t.Fatal(err)
	}
	tg, unlock, err := OpenLocked(ctx, ref, Options{}, true)
	if err != nil || tg == nil {
		t.Fatalf("OpenLocked = %v, %v", tg, err)
	}
	got := make(chan struct{})
	go func() {
		release, err := LockLayout(ref)
		if err == nil {
			release()
		}
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("a second lock was taken while OpenLocked held it")
	case <-time.After(100 * time.Millisecond):
	}
	unlock()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the lock was not released")
	}
	// Without lock, nothing is held: the release is a no-op.
	if _, unlock, err := OpenLocked(ctx, ref, Options{}, false); err != nil {
		t.Fatal(err)
	} else {
		unlock()
	}
}
