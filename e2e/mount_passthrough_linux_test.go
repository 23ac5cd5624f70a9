package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// fuseReadsOf returns the FUSE READ requests the mount served for p (the
// debug attribute user.bdnvol.fuse-reads).
func fuseReadsOf(t *testing.T, p string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(getxattr(t, p, "user.bdnvol.fuse-reads"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// coldRead drops the page cache of p, reads it whole and checks the bytes
// are want; it returns the FUSE READ requests the read cost.
func coldRead(t *testing.T, p string, want []byte) int64 {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	f.Close()
	before := fuseReadsOf(t, p)
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s: wrong bytes read through the mount (%v)", p, err)
	}
	return fuseReadsOf(t, p) - before
}

// A warm file is read through the mount by kernel passthrough: once its
// chunks are cached the mount makes its backing file, the next open reads
// the right bytes with zero FUSE READ requests, and so does the first open
// in a new mount process. With --no-passthrough every read goes through
// FUSE, with the right bytes.
func TestMountPassthroughWarmReads(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("passthrough needs root (CAP_SYS_ADMIN) under CI=true")
		}
		t.Skip("passthrough needs root")
	}
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "ckpt")
	if err := synth.Generate(src, synth.Options{TargetBytes: 24 << 20, Shards: 1, Layers: 2, Seed: 5}); err != nil {
		t.Fatal(err)
	}
	shards, _ := filepath.Glob(filepath.Join(src, "*.safetensors"))
	name := filepath.Base(shards[0])
	want, err := os.ReadFile(shards[0])
	if err != nil {
		t.Fatal(err)
	}
	repo := reg.Host + "/models/warm"
	push(t, repo, repo+":v1", src, "--chunk-min", "256KiB", "--chunk-avg", "512KiB", "--chunk-max", "1MiB")

	mp := mount(t, repo+":v1", "--prefetch", "none")
	p := filepath.Join(mp, name)
	if coldRead(t, p, want) == 0 {
		t.Fatal("the cold read made no FUSE READ request")
	}
	// The backing file is made in the background after the first close.
	var reads int64 = -1
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if reads = coldRead(t, p, want); reads == 0 {
			break
		}
	}
	if reads != 0 {
		t.Fatalf("a warm read still made %d FUSE READ requests after 30 s: passthrough not used", reads)
	}
	backings, _ := os.ReadDir(filepath.Join(home(t), "bdnvol", "chunks", "files"))
	if len(backings) != 1 {
		t.Fatalf("%d backing files in the cache, want 1", len(backings))
	}

	// A new mount process finds the backing file: its first open is served
	// by passthrough.
	mp2 := mount(t, repo+":v1", "--prefetch", "none")
	if n := coldRead(t, filepath.Join(mp2, name), want); n != 0 {
		t.Fatalf("first read in a new mount made %d FUSE READ requests, want 0", n)
	}

	// Forced off: every read is a FUSE READ, right bytes all the same.
	mp3 := mount(t, repo+":v1", "--prefetch", "none", "--no-passthrough")
	for range 2 {
		if n := coldRead(t, filepath.Join(mp3, name), want); n == 0 {
			t.Fatal("--no-passthrough: a read made no FUSE READ request")
		}
	}
}
