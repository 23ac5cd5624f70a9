package layout

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// TestPullSettlesRecentRecords: the files a pull writes last are recorded
// not racy (the pull waits out the racy margin and looks at them again),
// so an upgrade right after it copies their chunks without hashing them.
func TestPullSettlesRecentRecords(t *testing.T) {
	ctx := context.Background()
	store, v1, v2, f1, f2 := upgradeVersions(t)
	s1, _ := pushed(t, Params{Min: 16 << 10, Avg: 32 << 10, Max: 64 << 10}, f1)
	dst, statDir := t.TempDir(), t.TempDir()
	cache := func() *StatCache {
		c := OpenStatCache(statDir, dst, Params{})
		c.settleBytes = 1
		return c
	}
	start := time.Now()
	if _, err := Pull(ctx, s1, v1, dst, PullOptions{Jobs: 2, Cache: cache()}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < racyMargin {
		t.Errorf("the pull took %v: it did not wait out the racy margin (%v)", d, racyMargin)
	}
	c := cache()
	for p := range f1 {
		if rec, ok := c.data.Files[p]; !ok || rec.Racy {
			t.Errorf("%s: record %+v (found %v), want one not racy", p, rec, ok)
		}
	}
	res, err := Pull(ctx, store, v2, dst, PullOptions{Jobs: 2, Cache: c})
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, dst, f2, nil)
	if res.ChunksCopiedUnhashed == 0 {
		t.Errorf("upgrade right after the pull copied no chunk unhashed (copied %d, fetched %d)", res.ChunksCopied, res.ChunksFetched)
	}
}

// TestSettleDropsChangedRecords: a recent record whose file changed while
// settle waited is dropped; an unchanged one is saved not racy. A pull
// whose recent files are fewer bytes than the threshold does not wait.
func TestSettleDropsChangedRecords(t *testing.T) {
	ctx := context.Background()
	_, v1, _, _, _ := upgradeVersions(t)
	x := v1.Index
	statDir := t.TempDir()
	c := OpenStatCache(statDir, "/nowhere", Params{})
	c.settleBytes = 1
	now := time.Now().UnixNano()
	keys := map[string]StatKey{}
	for i := range x.Len() {
		if x.Kind(i) != TypeFile {
			continue
		}
		p := x.Path(i)
		keys[p] = StatKey{Size: x.size(i), Mtime: now, Ctime: now, Ino: uint64(i + 1)}
		c.storePulled(x, p, keys[p], true, true)
	}
	start := time.Now()
	c.settle(ctx, func(p string) (StatKey, bool) {
		k := keys[p]
		if p == "big.bin" {
			k.Ctime++ // changed since
		}
		return k, true
	})
	if d := time.Since(start); d < racyMargin {
		t.Errorf("settle returned after %v, before the racy margin (%v) passed", d, racyMargin)
	}
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	saved := OpenStatCache(statDir, "/nowhere", Params{})
	for p := range keys {
		rec, ok := saved.data.Files[p]
		switch {
		case p == "big.bin" && ok:
			t.Errorf("%s changed while settle waited, but its record was kept: %+v", p, rec)
		case p != "big.bin" && (!ok || rec.Racy || rec.Stat != keys[p] || rec.Digest == digest.Digest("")):
			t.Errorf("%s: saved %+v (found %v), want its key, not racy", p, rec, ok)
		}
	}

	// Below the threshold: no wait, records stay racy.
	c2 := OpenStatCache(filepath.Join(statDir, "2"), "/nowhere", Params{})
	c2.settleBytes = 1 << 40
	now = time.Now().UnixNano()
	for p, k := range keys {
		k.Mtime, k.Ctime = now, now
		c2.storePulled(x, p, k, true, true)
	}
	start = time.Now()
	c2.settle(ctx, func(string) (StatKey, bool) { t.Error("stat called below the threshold"); return StatKey{}, false })
	if d := time.Since(start); d >= racyMargin {
		t.Errorf("settle waited %v below the threshold", d)
	}
}
