package pull

import (
	"context"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// TestPullSettlesRecentRecords: the files a pull writes last are recorded
// not racy (the pull waits out the racy margin and looks at them again),
// so an upgrade right after it copies their chunks without hashing them.
func TestPullSettlesRecentRecords(t *testing.T) {
	ctx := context.Background()
	store, v1, v2, f1, f2 := upgradeVersions(t)
	s1, _ := pushed(t, layout.Params{Min: 16 << 10, Avg: 32 << 10, Max: 64 << 10}, f1)
	dst, statDir := t.TempDir(), t.TempDir()
	cache := func() *statcache.Cache {
		c := statcache.Open(statDir, dst, layout.Params{})
		c.SetTestHooks(nil, 1)
		return c
	}
	start := time.Now()
	if _, err := Materialise(ctx, s1, v1, dst, Options{Jobs: 2, StatCache: cache()}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < racyMargin {
		t.Errorf("the pull took %v: it did not wait out the racy margin (%v)", d, racyMargin)
	}
	c := cache()
	for p := range f1 {
		if rec, ok := c.PulledFiles().Get(p); !ok || rec.Racy {
			t.Errorf("%s: record %+v (found %v), want one not racy", p, rec, ok)
		}
	}
	res, err := Materialise(ctx, store, v2, dst, Options{Jobs: 2, StatCache: c})
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, dst, f2, nil)
	if res.ChunksCopiedUnhashed == 0 {
		t.Errorf("upgrade right after the pull copied no chunk unhashed (copied %d, fetched %d)", res.ChunksCopied, res.ChunksFetched)
	}
}
