package mounts

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/push"
)

// requireFUSE skips when FUSE cannot work here, except under CI=true,
// where it fails.
func requireFUSE(t *testing.T) {
	t.Helper()
	why := ""
	if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "no /dev/fuse"
	} else if _, err := exec.LookPath("fusermount3"); err != nil && os.Geteuid() != 0 {
		why = "not root and no fusermount3"
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("FUSE is unusable under CI=true: %s", why)
	}
	t.Skipf("FUSE is unusable: %s", why)
}

// testVolume seals a small tree into memory and opens it lazily.
func testVolume(t *testing.T) (*lazy.Volume, map[string]string) {
	t.Helper()
	files := map[string]string{"a.txt": "alpha\n", "sub/b.txt": "beta beta\n"}
	return testVolumeOf(t, files), files
}

// testVolumeOf is a volume of files (path to content), opened lazily.
func testVolumeOf(t *testing.T, files map[string]string) *lazy.Volume {
	t.Helper()
	dir := t.TempDir()
	for p, s := range files {
		full := filepath.Join(dir, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	store := memory.New()
	ctx := context.Background()
	res, err := push.Push(ctx, store, push.DirSource(dir), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := chunkcache.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	v, err := lazy.Open(ctx, store, res.Root, lazy.Options{Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

func TestServeAndUnmount(t *testing.T) {
	requireFUSE(t)
	v, files := testVolume(t)
	mp := t.TempDir()
	store := Store{Dir: t.TempDir()}
	d := v.Root().Digest.String()
	s, err := Serve(mp, v, "r.example/v@"+d, ServeOptions{Store: &store, CacheDir: "/c"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Detach(mp) })
	if m, ok := At(mp); !ok || m.Digest != d {
		t.Fatalf("At(%s) = %+v, %v; want digest %s", mp, m, ok, d)
	}
	st, ok := store.Read(mp)
	if !ok || st.Digest != d || st.PID != os.Getpid() || st.CacheDir != "/c" || st.Reference != "r.example/v@"+d {
		t.Fatalf("state = %+v, %v", st, ok)
	}
	if n := store.ServedBy(os.Getpid()); n != 1 {
		t.Errorf("ServedBy = %d, want 1", n)
	}
	for p, want := range files {
		b, err := os.ReadFile(filepath.Join(mp, p))
		if err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", p, b, err, want)
		}
	}
	buf := make([]byte, 128)
	n, err := unix.Getxattr(mp, lazy.XattrDigest, buf)
	if err != nil || string(buf[:n]) != d {
		t.Errorf("xattr %s = %q, %v; want %s", lazy.XattrDigest, buf[:n], err, d)
	}
	if err := os.WriteFile(filepath.Join(mp, "a.txt"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) && !errors.Is(err, syscall.EACCES) {
		t.Errorf("write into the mount: %v; want EROFS", err)
	}
	if NotConnected(mp) {
		t.Error("NotConnected on a served mount")
	}
	if err := s.Unmount(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done not closed after Unmount")
	}
	if _, ok := At(mp); ok {
		t.Fatal("still mounted after Unmount")
	}
	if _, ok := store.Read(mp); ok {
		t.Fatal("state kept after Unmount")
	}
	if how, err := store.Unmount(context.Background(), mp, 0); err != nil || how != Gone {
		t.Fatalf("Store.Unmount of nothing = %v, %v; want Gone", how, err)
	}
}

func TestUnmountStaleDetaches(t *testing.T) {
	requireFUSE(t)
	v, _ := testVolume(t)
	mp := t.TempDir()
	store := Store{Dir: t.TempDir()}
	s, err := Serve(mp, v, "r.example/v@"+v.Root().Digest.String(), ServeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Detach(mp) })
	// Record the mount as served by a process that is gone.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := store.Write(State{Mountpoint: mp, Digest: v.Root().Digest.String(), PID: dead.Process.Pid}); err != nil {
		t.Fatal(err)
	}
	var logged []string
	if err := store.Clear(mp, func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }); err != nil {
		t.Fatalf("Clear refused a mount whose process is gone: %v", err)
	}
	if _, ok := At(mp); ok {
		t.Fatal("Clear succeeded but the stale mount is still there")
	}
	if _, ok := store.Read(mp); ok {
		t.Fatal("Clear kept the stale mount's state")
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "removed a stale bdnvol mount") {
		t.Errorf("Clear reported %q", logged)
	}
	<-s.Done()
}

func TestUnmountDeadProcess(t *testing.T) {
	requireFUSE(t)
	v, _ := testVolume(t)
	mp := t.TempDir()
	store := Store{Dir: t.TempDir()}
	s, err := Serve(mp, v, "r.example/v@"+v.Root().Digest.String(), ServeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Detach(mp) })
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := store.Write(State{Mountpoint: mp, PID: dead.Process.Pid}); err != nil {
		t.Fatal(err)
	}
	how, err := store.Unmount(context.Background(), mp, 0)
	if err != nil || how != Stale {
		t.Fatalf("Unmount = %v, %v; want Stale", how, err)
	}
	if _, ok := At(mp); ok {
		t.Fatal("still mounted")
	}
	if _, ok := store.Read(mp); ok {
		t.Fatal("state kept")
	}
	<-s.Done()
}

func TestClearChecksMountpoint(t *testing.T) {
	store := Store{Dir: t.TempDir()}
	f := filepath.Join(t.TempDir(), "file")
	os.WriteFile(f, nil, 0o644)
	if err := store.Clear(f, nil); err == nil {
		t.Error("Clear accepted a file")
	}
	if err := store.Clear(filepath.Join(t.TempDir(), "missing"), nil); err == nil {
		t.Error("Clear accepted a missing directory")
	}
	if err := store.Clear(t.TempDir(), nil); err != nil {
		t.Errorf("Clear of an empty directory: %v", err)
	}
}
