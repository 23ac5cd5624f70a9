package mounts

import (
	"github.com/opencontainers/go-digest"

	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestServingSkipsStaleMounts(t *testing.T) {
	store := Store{Dir: t.TempDir()}
	d1, d2, d3 := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64), "sha256:"+strings.Repeat("3", 64)
	mp := func(name string) string {
		p := filepath.Join(t.TempDir(), name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	alive, dead, unrecorded, other := mp("alive"), mp("dead"), mp("unrecorded"), mp("other")
	for _, st := range []State{
		{Mountpoint: alive, Reference: "r.example/v:main", Digest: d1, PID: os.Getpid()},
		{Mountpoint: dead, Reference: "r.example/v:old", Digest: d2, PID: 1 << 30},
		{Mountpoint: other, Reference: "r.example/v:x", Digest: d1, PID: os.Getpid()},
	} {
		if err := store.Write(st); err != nil {
			t.Fatal(err)
		}
	}
	got := store.serving([]Mount{
		{Mountpoint: alive, Digest: d1},
		{Mountpoint: dead, Digest: d2},       // its server is gone
		{Mountpoint: unrecorded, Digest: d3}, // no state: named by its digest
		{Mountpoint: other, Digest: d3},      // the state is of another version
		{Mountpoint: mp("bad"), Digest: "not a digest"},
	})
	want := []Serving{
		{Mountpoint: alive, Reference: "r.example/v:main", Digest: digest.Digest(d1)},
		{Mountpoint: unrecorded, Reference: d3, Digest: digest.Digest(d3)},
		{Mountpoint: other, Reference: d3, Digest: digest.Digest(d3)},
	}
	if len(got) != len(want) {
		t.Fatalf("serving %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("serving[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
}
