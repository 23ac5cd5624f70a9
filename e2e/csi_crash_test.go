package e2e

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCSIStaleMountsAfterCrash kills the mounter and the node plugin with
// SIGKILL under published pods, as a crash or a reboot-less power cycle of
// the plugin pod does: the FUSE mounts and the pods' bind mounts stay with
// no server. With the state directory kept and with it lost, new processes
// clean up: a publish onto a target holding a dead mount succeeds and the
// pod reads the version, a publish to a new target too, an unpublish of a
// dead target leaves nothing mounted there, and no dead bdnvol mount is left
// under the node's directories.
func TestCSIStaleMountsAfterCrash(t *testing.T) {
	reg := newDistribution(t)
	repo := reg.Host + "/vols/crash"
	v1, _, _ := csiVersions(t, repo)
	for _, lost := range []bool{false, true} {
		name := "state kept"
		if lost {
			name = "state lost"
		}
		t.Run(name, func(t *testing.T) {
			n := startCSI(t, time.Minute)
			a, b := n.newPod("a"), n.newPod("b")
			n.mustPublish(a, repo+":prod", "")
			n.mustPublish(b, repo+":prod", "")
			waitReadable(t, filepath.Join(a.target, "readme.txt"))
			// A reader of b has big.bin open, its first 64 KiB read.
			big, err := os.ReadFile(filepath.Join(v1, "big.bin"))
			if err != nil {
				t.Fatal(err)
			}
			open, err := os.Open(filepath.Join(b.target, "big.bin"))
			if err != nil {
				t.Fatal(err)
			}
			defer open.Close()
			if _, err := open.ReadAt(make([]byte, 64<<10), 0); err != nil {
				t.Fatal(err)
			}

			n.kill9Node()
			n.kill9Mounter()
			// What the reader sees while there is no mounter: never a
			// hang, never wrong bytes.
			for _, off := range []int64{0, 2 << 20} {
				buf := make([]byte, 64<<10)
				start := time.Now()
				got, err := open.ReadAt(buf, off)
				t.Logf("MEASURE no mounter, an open file at offset %d (read before the kill: %v): %d bytes, %v, after %v",
					off, off == 0, got, err, time.Since(start).Round(time.Microsecond))
				if !bytes.Equal(buf[:got], big[off:off+int64(got)]) {
					t.Errorf("wrong bytes at offset %d with no mounter", off)
				}
				if off > 0 && !errors.Is(err, syscall.ENOTCONN) {
					t.Errorf("a read of bytes never read, with no mounter: %v, want ENOTCONN", err)
				}
			}
			took, err := timedRead(filepath.Join(a.target, "readme.txt"), 10*time.Second)
			t.Logf("MEASURE a read with no mounter: %v after %v", err, took.Round(time.Microsecond))
			if !errors.Is(err, syscall.ENOTCONN) {
				t.Errorf("a read on a dead mount: %v, want ENOTCONN", err)
			}
			if lost {
				if err := os.RemoveAll(n.stateDir); err != nil {
					t.Fatal(err)
				}
			}
			n.startMounter()
			n.startNode()

			if err := n.publish(a, repo+":prod", ""); err != nil {
				t.Fatalf("publish onto a target holding a dead mount: %v", err)
			}
			compareTrees(t, v1, a.target)
			c := n.newPod("c")
			n.mustPublish(c, repo+":prod", "")
			compareTrees(t, v1, c.target)
			if err := n.unpublish(b); err != nil {
				t.Fatalf("unpublish of a dead target: %v", err)
			}
			if err := os.Remove(b.target); err != nil && !os.IsNotExist(err) {
				t.Errorf("kubelet's removal of the unpublished dead target: %v", err)
			}
			if dead := deadMounts(t, n.root); len(dead) > 0 {
				t.Errorf("dead bdnvol mounts left: %v", dead)
			}
		})
	}
}

// timedRead reads p, giving up after limit, and says how long it took.
func timedRead(p string, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	done := make(chan error, 1)
	go func() { _, err := os.ReadFile(p); done <- err }()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(limit):
		return time.Since(start), errors.New("still blocked")
	}
}

// deadMounts lists the bdnvol mounts under root whose server is gone.
func deadMounts(t *testing.T, root string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var dead []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || !strings.HasPrefix(f[4], root+"/") || !strings.Contains(line, " - fuse.bdnvol ") {
			continue
		}
		var st syscall.Statfs_t
		if err := syscall.Statfs(f[4], &st); errors.Is(err, syscall.ENOTCONN) {
			dead = append(dead, f[4])
		}
	}
	return dead
}

// TestCSICacheEntriesTornOnDisk damages chunk cache entries on disk between
// two mounts of one version (one cut short, one with a byte flipped): the
// new mount's reader gets the right bytes, the registry is asked again for
// exactly the damaged chunks, and the intact ones come from the cache.
func TestCSICacheEntriesTornOnDisk(t *testing.T) {
	reg := newDistribution(t)
	proxy := newFaultProxy(t, reg)
	repo := proxy.Host + "/vols/torn"
	v1, _, _ := csiVersions(t, repo)
	n := startCSI(t, time.Minute)
	a := n.newPod("a")
	n.mustPublish(a, repo+":prod", "")
	compareTrees(t, v1, a.target)

	n.kill9Node()
	n.kill9Mounter() // its mount and page cache go with it
	dir := filepath.Join(n.cacheDir, "chunks", "sha256")
	es, err := os.ReadDir(dir)
	if err != nil || len(es) < 3 {
		t.Fatalf("cache entries: %d, %v; want at least 3", len(es), err)
	}
	var largest []os.DirEntry
	for _, e := range es {
		if fi, err := e.Info(); err == nil && fi.Size() > 1024 {
			largest = append(largest, e)
		}
	}
	if len(largest) < 2 {
		t.Fatalf("%d cache entries over 1 KiB, want 2", len(largest))
	}
	cut, flip := filepath.Join(dir, largest[0].Name()), filepath.Join(dir, largest[1].Name())
	fi, _ := largest[0].Info()
	if err := os.Truncate(cut, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(flip)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(flip, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// The files read were assembled into verified backing files for
	// passthrough, which would serve them without the chunks: this test
	// is about the chunk entries, so the backing files go.
	if err := os.RemoveAll(filepath.Join(n.cacheDir, "chunks", "files")); err != nil {
		t.Fatal(err)
	}
	n.startMounter()
	n.startNode()
	proxy.Set(faultConfig{})
	c := n.newPod("c")
	n.mustPublish(c, repo+":prod", "")
	compareTrees(t, v1, c.target)
	gets := proxy.blobGets()
	t.Logf("blob GETs after the damage: %v", gets)
	for _, e := range es {
		want := 0
		if e.Name() == largest[0].Name() || e.Name() == largest[1].Name() {
			want = 1
		}
		if got := gets["sha256:"+e.Name()]; got != want {
			t.Errorf("cached chunk %s fetched %d times after the damage, want %d", e.Name(), got, want)
		}
	}
}
