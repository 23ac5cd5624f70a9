package beneath

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOpenRefusesSymlinks: a symlink anywhere in the path, or a way out of
// the directory, is refused, with openat2 and stepwise alike; real paths open.
func TestOpenRefusesSymlinks(t *testing.T) {
	base := t.TempDir()
	root, out := filepath.Join(base, "root"), filepath.Join(base, "out")
	for _, d := range []string{filepath.Join(root, "a", "b"), filepath.Join(out, "b")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(root, "a", "b", "f"), filepath.Join(out, "b", "f"), filepath.Join(root, "file")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range [][2]string{{out, "link"}, {filepath.Join(out, "b", "f"), "flink"}, {"a", "rel"}} {
		if err := os.Symlink(l[0], filepath.Join(root, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	dfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	file := unix.O_RDONLY | unix.O_CLOEXEC
	for _, stepwise := range []bool{false, true} {
		var r Resolver
		r.Stepwise.Store(stepwise)
		for _, c := range []struct {
			rel   string
			flags int
			ok    bool
		}{
			{"a/b/f", file, true},
			{"a/b", DirFlags, true},
			{"link/b/f", file, false},
			{"link/b", DirFlags, false},
			{"rel/b/f", file, false},
			{"flink", file, false},
			{"link", DirFlags, false},
			{"../out/b/f", file, false},
			{"a/../a/b/f", file, false},
			{"file/x", file, false},
			{"file", DirFlags, false},
		} {
			t.Run(fmt.Sprintf("%s/stepwise=%v", c.rel, stepwise), func(t *testing.T) {
				fd, err := r.Open(dfd, c.rel, c.flags)
				if err == nil {
					unix.Close(fd)
				}
				if c.ok && err != nil {
					t.Fatalf("open: %v", err)
				}
				if !c.ok && (err == nil || !Unsafe(err)) {
					t.Fatalf("open: %v, want a refusal", err)
				}
			})
		}
	}
}

// TestReadlink: a target within max is read whole; a longer one comes back
// longer than max, for the caller to refuse.
func TestReadlink(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("a/b", filepath.Join(dir, "short")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("0123456789", filepath.Join(dir, "long")); err != nil {
		t.Fatal(err)
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	if got, err := Readlink(dfd, "short", 8); err != nil || got != "a/b" {
		t.Errorf("short: %q, %v", got, err)
	}
	if got, err := Readlink(dfd, "long", 8); err != nil || len(got) != 9 {
		t.Errorf("long: %q, %v; want 9 bytes, more than the 8 allowed", got, err)
	}
	if _, err := Readlink(dfd, "missing", 8); err == nil {
		t.Error("a missing link was read")
	}
}
