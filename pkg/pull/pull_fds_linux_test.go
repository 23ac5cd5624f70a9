package pull

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

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
