package lazy

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// fuseReads returns the FUSE READ requests the mount served for path.
func fuseReads(t *testing.T, path string) int64 {
	t.Helper()
	buf := make([]byte, 32)
	n, err := unix.Getxattr(path, XattrFUSEReads, buf)
	if err != nil {
		t.Fatalf("getxattr %s: %v", path, err)
	}
	k, err := strconv.ParseInt(string(buf[:n]), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// readThrough reads path whole (buffered reads and mmap) and checks the
// bytes are want.
func readThrough(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s: wrong bytes read (%v)", path, err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// MAP_POPULATE faults the pages in within the mmap call: a fault on a
	// page this process serves through FUSE, taken outside a system call,
	// cannot be stopped for the garbage collector, whose stop-the-world
	// then holds back the goroutines that would answer the FUSE READ.
	m, err := unix.Mmap(int(f.Fd()), 0, len(want), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	if !bytes.Equal(m, want) {
		t.Fatalf("%s: wrong bytes mapped", path)
	}
}

// dropPages drops the page cache of path, so the next read asks the
// file system again.
func dropPages(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}

// mountWarm mounts the fixture's volume with opt, reads big.bin once
// through it (filling the cache) and waits until the volume has made every
// backing file it is going to make: with backing, until one is made (the
// kernel's RELEASE, which starts it, arrives after close returns); without,
// for a short settling time and until no assembly runs.
func mountWarm(t *testing.T, opt MountOptions, backing bool) (mnt string, v *Volume, srv *fuse.Server, want []byte) {
	t.Helper()
	needFUSE(t)
	fx := newFixture(t)
	v = fx.open(t, t.TempDir(), Options{})
	mnt = t.TempDir()
	srv, err := Mount(mnt, v, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })
	want = fx.files["big.bin"]
	readThrough(t, filepath.Join(mnt, "big.bin"), want)
	if !backing {
		time.Sleep(200 * time.Millisecond)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		v.mu.Lock()
		busy := len(v.assembling)
		v.mu.Unlock()
		if busy == 0 && (!backing || v.opt.Cache.Stats().BackingsMade > 0) {
			break
		}
	}
	return mnt, v, srv, want
}

// A file whose chunks are all cached gets a backing file, and its next
// open is served by the kernel from it: right bytes, read and mapped,
// with no FUSE READ request.
func TestPassthroughServesWarmFile(t *testing.T) {
	mnt, v, srv, want := mountWarm(t, MountOptions{}, true)
	p := filepath.Join(mnt, "big.bin")
	if s := v.opt.Cache.Stats(); s.BackingsMade != 1 {
		t.Fatalf("stats %+v, want the backing file of big.bin made", s)
	}
	if srv.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH == 0 {
		t.Fatal("the kernel did not grant passthrough (needs Linux 6.9 or later and root)")
	}
	before := fuseReads(t, p)
	if before == 0 {
		t.Fatal("the first read was not served through FUSE")
	}
	// The root counts the mount's FUSE READs of all its files, whichever
	// inodes the kernel has since forgotten.
	all := fuseReads(t, mnt)
	if all < before {
		t.Fatalf("the root counts %d FUSE READ requests, fewer than big.bin's %d", all, before)
	}
	readThrough(t, p, want)
	if after := fuseReads(t, p); after != before {
		t.Fatalf("%d FUSE READ requests for a file served by passthrough, want 0", after-before)
	}
	if after := fuseReads(t, mnt); after != all {
		t.Fatalf("the root counts %d FUSE READ requests after a read served by passthrough, want %d", after, all)
	}
	if s := v.opt.Cache.Stats(); s.BackingsOpened < 2 {
		t.Fatalf("stats %+v, want the backing file opened again", s)
	}
}

// With passthrough forced off, or not granted by the kernel (the
// capability left out of INIT, so that registering a backing file fails),
// every read comes through FUSE, with the right bytes.
func TestPassthroughFallsBack(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opt       MountOptions
		backingOK bool // backing files are still made
	}{
		{"forced off", MountOptions{NoPassthrough: true}, false},
		{"not granted", MountOptions{disabledCaps: fuse.CAP_PASSTHROUGH}, false},
		{"registration refused", MountOptions{disabledCaps: fuse.CAP_PASSTHROUGH, forcePassthrough: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mnt, v, _, want := mountWarm(t, tc.opt, tc.backingOK)
			p := filepath.Join(mnt, "big.bin")
			if made := v.opt.Cache.Stats().BackingsMade; (made == 1) != tc.backingOK {
				t.Fatalf("%d backing files made, want them made: %v", made, tc.backingOK)
			}
			for range 2 {
				dropPages(t, p)
				before := fuseReads(t, p)
				readThrough(t, p, want)
				if fuseReads(t, p) == before {
					t.Fatal("reads bypassed FUSE without passthrough")
				}
			}
		})
	}
}

// A file whose chunks are all cached, with no backing file yet (the cache
// filled by reads outside the mount, as pull and warm do), is served by
// passthrough from its first open after the mount: the open makes its
// backing file, and no read of it is a FUSE READ.
func TestPassthroughFromFirstOpen(t *testing.T) {
	needFUSE(t)
	fx, v, want := filledVolume(t)
	if s := v.opt.Cache.Stats(); s.BackingsMade != 0 {
		t.Fatalf("stats %+v: a backing file made before the mount", s)
	}
	// The fill stands for a pull or a warm by another process: this
	// volume has fetched nothing since (one that has fetched serves an
	// open through FUSE, not waiting for a backing
	// file; TestOpenWhileFetchingIsNotHeldForAssembly).
	v.fetched.Store(0)
	mnt, p := mountPassthrough(t, v)
	readThrough(t, p, want)
	if n := fuseReads(t, p); n != 0 {
		t.Fatalf("%d FUSE READ requests from the first open on, want 0", n)
	}
	if s := v.opt.Cache.Stats(); s.BackingsMade != 1 {
		t.Fatalf("stats %+v, want the backing file made by the first open", s)
	}
	// A file with a chunk not cached is still served through FUSE, and
	// gets no backing file from its open.
	p = filepath.Join(mnt, "model-00001-of-00001.safetensors")
	readThrough(t, p, fx.files["model-00001-of-00001.safetensors"])
	if fuseReads(t, p) == 0 {
		t.Fatal("a file not cached was read without FUSE READ requests")
	}
}

// The kernel asks FLUSH once per mount: the first close gets ENOSYS, and
// later closes send none (two opens and closes of each of two files, read
// through FUSE and by passthrough).
func TestFlushAskedOnce(t *testing.T) {
	needFUSE(t)
	fx := newFixture(t)
	v := fx.open(t, t.TempDir(), Options{})
	var flushes atomic.Int64
	mnt := t.TempDir()
	srv, err := Mount(mnt, v, MountOptions{onFlush: func() { flushes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })
	for _, name := range []string{"big.bin", "config.json"} {
		for range 2 {
			readThrough(t, filepath.Join(mnt, name), fx.files[name])
		}
	}
	if n := flushes.Load(); n != 1 {
		t.Fatalf("%d FLUSH requests for 4 opens and closes, want 1", n)
	}
}

// A file opened after its volume fetched (a cold start, a profile
// replayed), even long after, is served through FUSE at once, not held
// while its backing file is made; the backing file is made once the volume
// has been quiet, and the opens after that are served by passthrough.
func TestOpenWhileFetchingIsNotHeldForAssembly(t *testing.T) {
	needFUSE(t)
	_, v, want := filledVolume(t)
	_, p := mountPassthrough(t, v)
	// The volume's last fetch was a while ago: a loader reaches a large
	// model's last shard long after the replay fetched it.
	v.fetched.Store(time.Now().Add(-time.Minute).UnixNano())
	readThrough(t, p, want)
	if n := fuseReads(t, p); n == 0 {
		t.Fatal("an open after the volume fetched waited for a backing file; want it served through FUSE")
	}
	deadline := time.Now().Add(10 * time.Second)
	for v.opt.Cache.Stats().BackingsMade == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no backing file made once the volume was quiet")
		}
		time.Sleep(20 * time.Millisecond)
	}
	dropPages(t, p)
	before := fuseReads(t, p)
	readThrough(t, p, want)
	if n := fuseReads(t, p); n != before {
		t.Fatalf("%d FUSE READ requests after the backing file was made, want 0", n-before)
	}
}

// filledVolume opens the fixture's volume and reads big.bin through it,
// so that the file's chunks are all cached; it returns the fixture, the
// volume and the file's bytes.
func filledVolume(t *testing.T) (*fixture, *Volume, []byte) {
	t.Helper()
	fx := newFixture(t)
	v := fx.open(t, t.TempDir(), Options{})
	f, err := v.Open("big.bin")
	if err != nil {
		t.Fatal(err)
	}
	want := fx.files["big.bin"]
	if got := readAll(t, f); !bytes.Equal(got, want) {
		t.Fatal("wrong bytes read from the volume")
	}
	// The read may have started background fetches (the next file's
	// first chunks); a test that sets the volume's fetch clock must not
	// have one of them reset it.
	v.wg.Wait()
	return fx, v, want
}

// mountPassthrough mounts v and fails unless the kernel grants
// passthrough; it returns the mountpoint and the path of big.bin in it.
func mountPassthrough(t *testing.T, v *Volume) (string, string) {
	t.Helper()
	mnt := t.TempDir()
	srv, err := Mount(mnt, v, MountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })
	if srv.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH == 0 {
		t.Fatal("the kernel did not grant passthrough (needs Linux 6.9 or later and root)")
	}
	return mnt, filepath.Join(mnt, "big.bin")
}

// TestBackgroundAssemblyRunsIdle: a backing file made in the background
// is made on a thread of the idle scheduling class, so that it takes no
// CPU from reads and fetches.
func TestBackgroundAssemblyRunsIdle(t *testing.T) {
	policy := make(chan int, 4)
	old := onBackgroundAssembly
	onBackgroundAssembly = func() {
		attr, err := unix.SchedGetAttr(0, 0)
		if err != nil {
			t.Errorf("sched_getattr: %v", err)
			policy <- -1
			return
		}
		policy <- int(attr.Policy)
	}
	t.Cleanup(func() { onBackgroundAssembly = old })
	mountWarm(t, MountOptions{}, true)
	select {
	case p := <-policy:
		if p != unix.SCHED_IDLE {
			t.Fatalf("the backing file was made under scheduling policy %d, want SCHED_IDLE (%d)", p, unix.SCHED_IDLE)
		}
	default:
		t.Fatal("no backing file was made in the background")
	}
}
