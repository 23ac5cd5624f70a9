package mounts

import (
	"context"
	"testing"
)

func TestWaitThenUnmountAll(t *testing.T) {
	requireFUSE(t)
	store := Store{Dir: t.TempDir()}
	var all []*Served
	for range 2 {
		v, _ := testVolume(t)
		mp := t.TempDir()
		s, err := Serve(mp, v, "r.example/v@"+v.Root().Digest.String(), ServeOptions{Store: &store})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { Detach(mp) })
		all = append(all, s)
	}
	// One goes away on its own; then a cancel leaves the other to unmount.
	if err := all[0].Unmount(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var gone, unmounted []string
	go func() {
		<-all[0].Done()
		cancel()
	}()
	// The cancel may win the race with the report of the first mount.
	if !Wait(ctx, all, func(s *Served) { gone = append(gone, s.Mountpoint) }) {
		t.Fatal("Wait reported every mount gone; one is still served")
	}
	if len(gone) > 1 || len(gone) == 1 && gone[0] != all[0].Mountpoint {
		t.Errorf("gone %q", gone)
	}
	if err := UnmountAll(all, func(s *Served) { unmounted = append(unmounted, s.Mountpoint) }); err != nil {
		t.Fatal(err)
	}
	if len(unmounted) != 1 || unmounted[0] != all[1].Mountpoint {
		t.Errorf("unmounted %q, want only %s", unmounted, all[1].Mountpoint)
	}
	if _, ok := At(all[1].Mountpoint); ok {
		t.Error("still mounted after UnmountAll")
	}
	// Everything gone: Wait returns false at once.
	if Wait(context.Background(), all, nil) {
		t.Error("Wait reported mounts still served after all were unmounted")
	}
}
