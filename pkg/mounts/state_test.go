package mounts

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestStateRoundTrip(t *testing.T) {
	s := Store{Dir: filepath.Join(t.TempDir(), "state")}
	want := State{Mountpoint: "/mnt/a b", Reference: "r.example/v@sha256:ab", Digest: "sha256:ab", PID: 42,
		CacheDir: "/c", Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	if _, ok := s.Read(want.Mountpoint); ok {
		t.Fatal("Read found state in an empty store")
	}
	if err := s.Write(want); err != nil {
		t.Fatal(err)
	}
	got, ok := s.Read(want.Mountpoint)
	if !ok || got != want {
		t.Fatalf("Read = %+v, %v; want %+v", got, ok, want)
	}
	if _, ok := s.Read("/mnt/other"); ok {
		t.Fatal("Read found state for another mountpoint")
	}
	if _, err := os.Stat(s.Path(want.Mountpoint) + ".tmp"); !os.IsNotExist(err) {
		t.Fatalf("temporary file left behind: %v", err)
	}
	s.Remove(want.Mountpoint, 7)
	if _, ok := s.Read(want.Mountpoint); !ok {
		t.Fatal("Remove with another pid removed the state")
	}
	s.Remove(want.Mountpoint, 42)
	if _, ok := s.Read(want.Mountpoint); ok {
		t.Fatal("Remove with the owner's pid kept the state")
	}
	if err := s.Write(want); err != nil {
		t.Fatal(err)
	}
	s.Remove(want.Mountpoint, 0)
	if _, ok := s.Read(want.Mountpoint); ok {
		t.Fatal("Remove with pid 0 kept the state")
	}
}

func TestStateRejectsForeignFile(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	// A state file whose mountpoint is not the one asked for (a hash
	// collision, or a file copied by hand) is not trusted; neither is junk.
	if err := os.WriteFile(s.Path("/a"), []byte(`{"mountpoint":"/b","pid":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Read("/a"); ok {
		t.Fatal("Read trusted the state of another mountpoint")
	}
	if err := os.WriteFile(s.Path("/a"), []byte(`{not json`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Read("/a"); ok {
		t.Fatal("Read trusted a malformed state file")
	}
	if Key("/a") == Key("/b") || len(Key("/a")) != 16 {
		t.Fatalf("Key: %q %q", Key("/a"), Key("/b"))
	}
}
