package pull

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// laterCache opens the stat cache of dst in dir with a clock a second
// ahead: what a pull records is not racy.
func laterCache(dir, dst string) *statcache.Cache {
	c := statcache.Open(dir, dst, layout.Params{})
	c.SetTestHooks(func() time.Time { return time.Now().Add(time.Second) }, 0)
	return c
}

// TestPullUpgradeHashesNoRecordedFile: a file an earlier pull wrote, of
// the size of the new version's file but recorded with another digest (a
// fine-tune), is not read whole to compare digests; a file with no record
// is; and one recorded with the new file's digest but other chunks (the
// same bytes cut otherwise) is hashed and kept.
func TestPullUpgradeHashesNoRecordedFile(t *testing.T) {
	ctx := context.Background()
	store, v1, v2, f1, f2 := upgradeVersions(t)
	s1, _ := pushed(t, layout.Params{Min: 16 << 10, Avg: 32 << 10, Max: 64 << 10}, f1)
	dst, statDir := t.TempDir(), t.TempDir()
	if _, err := Materialise(ctx, s1, v1, dst, Options{Jobs: 2, StatCache: laterCache(statDir, dst)}); err != nil {
		t.Fatal(err)
	}
	res, err := Materialise(ctx, store, v2, dst, Options{Jobs: 2, StatCache: laterCache(statDir, dst)})
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, dst, f2, nil)
	if res.FilesHashed != 0 {
		t.Errorf("upgrade hashed %d files in place; big.bin is recorded with v1's digest and needs no read", res.FilesHashed)
	}

	// The same upgrade with no record: big.bin (same size) is hashed.
	dst2 := t.TempDir()
	if _, err := Materialise(ctx, s1, v1, dst2, Options{Jobs: 2}); err != nil {
		t.Fatal(err)
	}
	res, err = Materialise(ctx, store, v2, dst2, Options{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, dst2, f2, nil)
	if res.FilesHashed == 0 {
		t.Error("upgrade with no record hashed no file of the same size in place")
	}

	// v2's bytes cut with other parameters: same digests, other chunks.
	sOther, vOther := pushed(t, layout.Params{Min: 8 << 10, Avg: 16 << 10, Max: 32 << 10}, f2)
	res, err = Materialise(ctx, sOther, vOther, dst, Options{Jobs: 2, StatCache: laterCache(statDir, dst)})
	if err != nil {
		t.Fatal(err)
	}
	checkPulled(t, dst, f2, nil)
	if res.FilesHashed == 0 || res.ChunksFetched != 0 {
		t.Errorf("re-cut version: %d files hashed, %d chunks fetched; want the recorded files hashed and kept", res.FilesHashed, res.ChunksFetched)
	}
}

// TestPullUpgradeReplacesInPlace: a file replaced by an upgrade is swapped
// with its new version (no flush of the new file first) and the old one is
// removed, not left in the private directory; a reader holding the old
// file keeps reading v1's bytes.
func TestPullUpgradeReplacesInPlace(t *testing.T) {
	ctx := context.Background()
	store, v1, v2, f1, f2 := upgradeVersions(t)
	s1, _ := pushed(t, layout.Params{Min: 16 << 10, Avg: 32 << 10, Max: 64 << 10}, f1)
	dst := t.TempDir()
	if _, err := Materialise(ctx, s1, v1, dst, Options{Jobs: 2}); err != nil {
		t.Fatal(err)
	}
	old, err := os.Open(filepath.Join(dst, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := Materialise(ctx, store, v2, dst, Options{Jobs: 2}); err != nil {
		t.Fatal(err)
	}
	checkPulled(t, dst, f2, nil)
	info, err := old.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if n := info.Sys().(*syscall.Stat_t).Nlink; n != 0 {
		t.Errorf("the replaced big.bin still has %d links: left somewhere", n)
	}
	got := make([]byte, len(f1["big.bin"]))
	if _, err := old.ReadAt(got, 0); err != nil || string(got) != string(f1["big.bin"]) {
		t.Errorf("a reader of the old big.bin lost its bytes (err %v)", err)
	}
}
