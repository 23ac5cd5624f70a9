package mounts

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestUnmountWithBindIsBounded: a mount that a bind mount elsewhere keeps
// (a pod's target, with a file open) is unmounted within a bound, by
// Unmount and by Stop alike: its FUSE connection is aborted. The FUSE
// server's own Unmount waits for ever there.
func TestUnmountWithBindIsBounded(t *testing.T) {
	requireFUSE(t)
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("bind mounts need root; CI=true must run as root")
		}
		t.Skip("bind mounts need root")
	}
	for _, c := range []struct {
		name  string
		stop  func(*Served) error
		bound time.Duration
	}{
		{"Unmount", (*Served).Unmount, 10 * time.Second},
		{"Stop", func(s *Served) error { return s.Stop(500 * time.Millisecond) }, 4 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, _ := testVolume(t)
			mp, bind := t.TempDir(), t.TempDir()
			s, err := Serve(mp, v, "r.example/v@"+v.Root().Digest.String(), ServeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { Detach(mp) })
			if err := unix.Mount(mp, bind, "", unix.MS_BIND, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Unmount(bind, unix.MNT_DETACH) })
			f, err := os.Open(filepath.Join(bind, "a.txt"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			start := time.Now()
			res := make(chan error, 1)
			go func() { res <- c.stop(s) }()
			select {
			case err := <-res:
				t.Logf("%s returned after %v: %v", c.name, time.Since(start).Round(time.Millisecond), err)
			case <-time.After(c.bound + 20*time.Second):
				t.Fatalf("%s still waiting after %v", c.name, c.bound+20*time.Second)
			}
			if took := time.Since(start); took > c.bound {
				t.Errorf("%s took %v, want under %v", c.name, took, c.bound)
			}
			select {
			case <-s.Done():
			default:
				t.Error("the server still runs")
			}
			if _, ok := At(mp); ok {
				t.Error("still mounted at its mountpoint")
			}
			if _, err := os.ReadFile(filepath.Join(bind, "sub/b.txt")); err == nil {
				t.Error("the bind still reads a server that is gone")
			}
		})
	}
}
