package mounts

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

func TestUnmountAllRefusesWhatIsNotAMount(t *testing.T) {
	called := false
	err := Store{Dir: t.TempDir()}.UnmountAll(context.Background(), t.TempDir(), 0, func(Mount, Outcome) { called = true })
	if err == nil || !strings.Contains(err.Error(), "not a bdnvol mount") || called {
		t.Fatalf("UnmountAll of a plain directory: %v (done called: %v)", err, called)
	}
}

func TestUnmountAllUnmountsEveryMountUnderARoot(t *testing.T) {
	requireFUSE(t)
	root := t.TempDir()
	store := Store{Dir: t.TempDir()}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	var served []*Served
	for _, name := range []string{"a", "b"} {
		v, _ := testVolume(t)
		mp := filepath.Join(root, name)
		if err := os.MkdirAll(mp, 0o755); err != nil {
			t.Fatal(err)
		}
		s, err := Serve(mp, v, "r.example/v@"+v.Root().Digest.String(), ServeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { Detach(mp) })
		// Recorded as served by a process that is gone: detached at once.
		if err := store.Write(State{Mountpoint: mp, PID: dead.Process.Pid}); err != nil {
			t.Fatal(err)
		}
		served = append(served, s)
	}
	var done []string
	err := store.UnmountAll(context.Background(), root, 0, func(m Mount, how Outcome) {
		if how != Stale {
			t.Errorf("%s: outcome %v, want Stale", m.Mountpoint, how)
		}
		done = append(done, filepath.Base(m.Mountpoint))
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(done)
	if strings.Join(done, ",") != "a,b" {
		t.Errorf("done told of %q, want a and b", done)
	}
	for _, s := range served {
		<-s.Done()
		if _, ok := At(s.Mountpoint); ok {
			t.Errorf("%s still mounted", s.Mountpoint)
		}
	}
}
