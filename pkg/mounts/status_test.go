package mounts

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStatusesReportRecordedStateAndStaleness(t *testing.T) {
	store := Store{Dir: t.TempDir()}
	d1, d2 := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64)
	alive, dead, other := t.TempDir(), t.TempDir(), t.TempDir()
	for _, st := range []State{
		{Mountpoint: alive, Reference: "r.example/v:main", Digest: d1, PID: os.Getpid()},
		{Mountpoint: dead, Reference: "r.example/v:old", Digest: d2, PID: 1 << 30},
		{Mountpoint: other, Reference: "r.example/v:x", Digest: d2, PID: os.Getpid()},
	} {
		if err := store.Write(st); err != nil {
			t.Fatal(err)
		}
	}
	got := store.statuses([]Mount{{alive, d1}, {dead, d2}, {other, d1}})
	want := []Status{
		{Mountpoint: alive, Digest: d1, Reference: "r.example/v:main", PID: os.Getpid()},
		{Mountpoint: dead, Digest: d2, Reference: "r.example/v:old", PID: 1 << 30, Stale: true},
		{Mountpoint: other, Digest: d1}, // the state is of another version
	}
	if len(got) != len(want) {
		t.Fatalf("statuses %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("status %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	// No mounts is an empty JSON array, not null.
	if b, _ := json.Marshal(store.statuses(nil)); string(b) != "[]" {
		t.Errorf("no mounts: %s", b)
	}
	b, _ := json.Marshal(got[2])
	if string(b) != `{"mountpoint":"`+other+`","digest":"`+d1+`","stale":false}` {
		t.Errorf("JSON %s", b)
	}
}

func TestTargetsOfAPathWithoutMounts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "root")
	os.Mkdir(dir, 0o755)
	if _, err := Targets(dir); err == nil || err.Error() != dir+": not a bdnvol mount" {
		t.Errorf("Targets(%s) = %v", dir, err)
	}
}

func TestTargetsFindsAMountAndTheMountsUnderASpecRoot(t *testing.T) {
	requireFUSE(t)
	root := t.TempDir()
	store := Store{Dir: t.TempDir()}
	var mps []string
	for _, name := range []string{"a", "b"} {
		v, _ := testVolume(t)
		mp := filepath.Join(root, name)
		os.Mkdir(mp, 0o755)
		if _, err := Serve(mp, v, "r.example/v@"+v.Root().Digest.String(), ServeOptions{Store: &store}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { Detach(mp) })
		mps = append(mps, mp)
	}
	if ms, err := Targets(mps[0]); err != nil || len(ms) != 1 || ms[0].Mountpoint != mps[0] {
		t.Errorf("Targets(mount) = %+v, %v", ms, err)
	}
	if ms, err := Targets(root); err != nil || len(ms) != 2 {
		t.Errorf("Targets(root) = %+v, %v", ms, err)
	}
	st, err := store.Statuses()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range st {
		if strings.HasPrefix(s.Mountpoint, root+"/") && s.PID == os.Getpid() && !s.Stale {
			n++
		}
	}
	if n != 2 {
		t.Errorf("Statuses = %+v; want both mounts served by this process", st)
	}
}

func TestDefaultStore(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/7")
	if got := DefaultStore("/c").Dir; got != "/run/user/7/bdnvol/mounts" {
		t.Errorf("with XDG_RUNTIME_DIR: %s", got)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	if got := DefaultStore("/c").Dir; got != "/c/mounts" {
		t.Errorf("without XDG_RUNTIME_DIR: %s", got)
	}
}
