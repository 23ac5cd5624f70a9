package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mountTmpfs mounts a tmpfs of the given size (e.g. "8m") on a new directory,
// unmounted in t.Cleanup. It fails the test under CI=true if it cannot.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	unmount := func() {
		if err := unmountNow(dir); err != nil {
			detachMount(dir)
		}
	}
	err := mountTmpfsAt(dir, "size="+size+",mode=0755")
	if err != nil {
		// Not root: passwordless sudo, as CI machines often have.
		opts := fmt.Sprintf("size=%s,mode=0755,uid=%d,gid=%d", size, os.Getuid(), os.Getgid())
		if out, serr := exec.Command("sudo", "-n", "mount", "-t", "tmpfs", "-o", opts, "tmpfs", dir).CombinedOutput(); serr == nil {
			err = nil
			unmount = func() { exec.Command("sudo", "-n", "umount", "-l", dir).Run() }
		} else {
			err = fmt.Errorf("%v; sudo mount: %v: %s", err, serr, out)
		}
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount -t tmpfs -o size=%s: %v (the disk-full tests need root, CAP_SYS_ADMIN or passwordless sudo under CI=true)", size, err)
		}
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(unmount)
	return dir
}

// diskFullTree is 12 MiB and a little, too much for an 8 MiB file system.
func diskFullTree() []node {
	return []node{
		fileNode("a-small.txt", 0o644, []byte("small file\n")),
		fileNode("b.bin", 0o644, randBytes(801, 4<<20)),
		fileNode("c.bin", 0o644, randBytes(802, 4<<20)),
		fileNode("d.bin", 0o644, randBytes(803, 4<<20)),
		fileNode("z-small.txt", 0o644, []byte("another small file\n")),
	}
}

// TestPullDiskFull pulls a volume bigger than the file system it goes to:
// a clear error, and no file under its final name with the wrong contents.
func TestPullDiskFull(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, diskFullTree(), time.Time{})
	repo := reg.Host + "/vols/full"
	push(t, repo, repo+":v1", src, smallChunks...)

	dst := filepath.Join(mountTmpfs(t, "8m"), "dst")
	res := run(t, "pull", repo+":v1", dst)
	if res.code == 0 {
		t.Fatalf("pull of 12 MiB into an 8 MiB file system succeeded:\n%s", res)
	}
	last := checkCleanFailure(t, res)
	if !strings.Contains(last, "no space left on device") {
		t.Errorf("the error does not say the disk is full: %q", last)
	}
	checkNoWrongFile(t, src, dst)
}

// TestMountCacheDiskFull mounts a volume whose chunk cache is on a file
// system too small for it and reads every file: each read gives the right
// bytes or EIO, and every cache entry left is whole (its SHA-256 is its name).
func TestMountCacheDiskFull(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, diskFullTree(), time.Time{})
	repo := reg.Host + "/vols/fullcache"
	push(t, repo, repo+":v1", src, smallChunks...)

	cache := filepath.Join(mountTmpfs(t, "8m"), "cache")
	mp, res := tryMount(t, repo+":v1", "--cache-dir", cache, "--prefetch", "none")
	if res.code != 0 {
		t.Fatalf("mount with an empty cache on a small file system:\n%s", res)
	}
	for pass := range 2 {
		if eio := readThroughMount(t, src, mp); len(eio) > 0 {
			t.Logf("pass %d: EIO on %v", pass, eio)
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(cache, &st); err == nil {
		t.Logf("cache file system: %d of %d KiB free", st.Bavail*uint64(st.Bsize)>>10, st.Blocks*uint64(st.Bsize)>>10)
	}
	checkCacheEntries(t, cache)
	// The volume does not fit: the cache must have run out of space.
	if st.Bavail*uint64(st.Bsize) > 1<<20 {
		t.Errorf("test setup: the cache file system still has %d bytes free; the disk never filled", st.Bavail*uint64(st.Bsize))
	}
}

// checkCacheEntries fails the test unless every entry of the chunk cache
// under dir (dir/chunks/sha256/HEX) has the SHA-256 HEX.
func checkCacheEntries(t *testing.T, dir string) {
	t.Helper()
	entries := 0
	err := filepath.WalkDir(filepath.Join(dir, "chunks", "sha256"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != d.Name() {
			t.Errorf("corrupt cache entry %s: %d bytes with SHA-256 %x", p, len(b), sum)
		}
		entries++
		return nil
	})
	if err != nil {
		t.Fatalf("walking the cache: %v", err)
	}
	t.Logf("%d cache entries, all whole", entries)
}
