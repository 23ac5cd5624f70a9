package pull

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// TestPullBoundedDescriptors pulls thousands of small files packed into a
// few chunks: descriptors open at once stay about jobs times a few, not
// one per file of a chunk.
func TestPullBoundedDescriptors(t *testing.T) {
	files := map[string][]byte{}
	for i := range 3000 {
		files[fmt.Sprintf("d%02d/f%04d", i%30, i)] = testutil.RandBytes(uint64(i), 512)
	}
	store, v := pushed(t, layout.Params{Min: 512 << 10, Avg: 1 << 20, Max: 2 << 20}, files)
	if v.NumChunks() > 4 {
		t.Fatalf("premise: small files packed into few chunks, got %d", v.NumChunks())
	}
	des, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	base := int64(len(des))
	c := &fdSamplingFetcher{Fetcher: store}
	dst := t.TempDir()
	if _, err := Materialise(context.Background(), c, v, dst, Options{Jobs: 2}); err != nil {
		t.Fatal(err)
	}
	if got := c.maxFDs.Load() - base; got > 2*maxOpenPerChunk+8 {
		t.Errorf("%d descriptors open at once during the pull (jobs 2)", got)
	}
	t.Logf("at most %d descriptors beyond the %d before", c.maxFDs.Load()-base, base)
	checkPulled(t, dst, files, nil)
}

// TestPullUnderFDLimit runs a pull of many files with 8 jobs in a child
// process whose RLIMIT_NOFILE leaves room for 6 descriptors beyond those
// open: the pull lowers its jobs to fit, succeeds, and holds no more than
// its bound for the jobs it ran.
func TestPullUnderFDLimit(t *testing.T) {
	if os.Getenv("BDNVOL_FDLIMIT_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPullUnderFDLimit$", "-test.v")
		cmd.Env = append(os.Environ(), "BDNVOL_FDLIMIT_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestPullUnderFDLimit") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		t.Logf("child:\n%s", out)
		return
	}
	files := map[string][]byte{}
	for i := range 2000 {
		files[fmt.Sprintf("d%02d/f%04d", i%20, i)] = testutil.RandBytes(uint64(i), 700)
	}
	for i := range 8 {
		files[fmt.Sprintf("big/b%d", i)] = testutil.RandBytes(uint64(10000+i), 300<<10)
	}
	store, v := pushed(t, layout.Params{Min: 16 << 10, Avg: 64 << 10, Max: 128 << 10}, files)
	dst := t.TempDir()
	des, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	base := uint64(len(des))
	limit := base + 6
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		t.Fatal(err)
	}
	jobs := jobsForLimit(8, base, limit)
	c := &fdSamplingFetcher{Fetcher: store}
	if _, err := Materialise(context.Background(), c, v, dst, Options{Jobs: 8}); err != nil {
		t.Fatalf("pull under a limit of %d open files (%d open before): %v", limit, base, err)
	}
	if got := c.maxFDs.Load() - int64(base); got > int64(fdBound(jobs)) {
		t.Errorf("%d descriptors open at once beyond the %d before, bound for %d jobs %d", got, base, jobs, fdBound(jobs))
	}
	t.Logf("limit %d, %d open before, %d jobs, at most %d beyond", limit, base, jobs, c.maxFDs.Load()-int64(base))
	checkPulled(t, dst, files, nil)
}

// TestPullSharesDirectoryDescriptors pulls many small files of one
// directory, packed into many chunks, with 8 jobs: the jobs writing into
// the directory at once share one descriptor of it, not one each.
func TestPullSharesDirectoryDescriptors(t *testing.T) {
	files := map[string][]byte{}
	for i := range 6000 {
		files[fmt.Sprintf("one/f%05d", i)] = testutil.RandBytes(uint64(i), 600)
	}
	store, v := pushed(t, layout.Params{Min: 32 << 10, Avg: 64 << 10, Max: 128 << 10}, files)
	if v.NumChunks() < 16 {
		t.Fatalf("premise: the files packed into many chunks, got %d", v.NumChunks())
	}
	dst := t.TempDir()
	dir := filepath.Join(dst, "one")
	stop := make(chan struct{})
	most := make(chan int)
	go func() {
		m := 0
		for {
			select {
			case <-stop:
				most <- m
				return
			default:
			}
			des, _ := os.ReadDir("/proc/self/fd")
			n := 0
			for _, e := range des {
				if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && l == dir {
					n++
				}
			}
			m = max(m, n)
			time.Sleep(200 * time.Microsecond)
		}
	}()
	_, err := Materialise(context.Background(), store, v, dst, Options{Jobs: 8})
	close(stop)
	m := <-most
	if err != nil {
		t.Fatal(err)
	}
	if m > 1 {
		t.Errorf("%d descriptors of the one directory open at once, want 1 shared by the jobs", m)
	}
	t.Logf("at most %d descriptors of the directory at once", m)
	checkPulled(t, dst, files, nil)
}
