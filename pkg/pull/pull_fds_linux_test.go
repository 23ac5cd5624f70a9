package pull

import (
	"context"
	"fmt"
	"os"
	"testing"

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
