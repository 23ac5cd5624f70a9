package pull

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// upgradeVersions pushes v1 and v2 of a tree into one store: v2 changes
// 64 KiB in the middle of a 1 MiB file, drops one file and adds one.
func upgradeVersions(t *testing.T) (store *testutil.CountingFetcher, v1, v2 *layout.Version, f1, f2 map[string][]byte) {
	t.Helper()
	big := testutil.RandBytes(7, 1<<20)
	f1 = map[string][]byte{"big.bin": big, "d/same": testutil.RandBytes(8, 300<<10), "old": testutil.RandBytes(9, 100<<10), "small": []byte("s")}
	big2 := append([]byte(nil), big...)
	copy(big2[512<<10:], testutil.RandBytes(10, 64<<10))
	f2 = map[string][]byte{"big.bin": big2, "d/same": f1["d/same"], "new": testutil.RandBytes(11, 100<<10), "small": []byte("s")}
	p := layout.Params{Min: 16 << 10, Avg: 32 << 10, Max: 64 << 10}
	s1, v1 := pushed(t, p, f1)
	s2, v2 := pushed(t, p, f2)
	_ = s1
	return &testutil.CountingFetcher{Fetcher: s2}, v1, v2, f1, f2
}

func fetchedBytes(c *testutil.CountingFetcher, v *layout.Version) int64 {
	size := map[digest.Digest]int64{}
	for _, ch := range v.ChunkDescriptors() {
		size[ch.Digest] = ch.Size
	}
	var n int64
	for d, k := range c.Counts() {
		n += int64(k) * size[d]
	}
	return n
}

// TestPullUpgradeFetchesOnlyChanges: pulling v2 over a directory holding
// v1 fetches only the chunks v1 did not have; the tree is v2's exactly,
// files v1 had and v2 lacks are removed, a file the user added stays.
func TestPullUpgradeFetchesOnlyChanges(t *testing.T) {
	ctx := context.Background()
	store, v1, v2, f1, f2 := upgradeVersions(t)
	_ = f1
	// v1 comes from its own store; v2's store only has what v2 needs.
	s1, _ := pushed(t, layout.Params{Min: 16 << 10, Avg: 32 << 10, Max: 64 << 10}, f1)
	dst := t.TempDir()
	cache := func() *statcache.Cache {
		return statcache.Open(filepath.Join(t.TempDir(), "..", "statcache"), dst, layout.Params{})
	}
	if _, err := Materialise(ctx, s1, v1, dst, Options{Jobs: 2, StatCache: cache()}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "mine"), []byte("user's"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := Materialise(ctx, store, v2, dst, Options{Jobs: 2, StatCache: cache()})
	if err != nil {
		t.Fatal(err)
	}
	// What must come over the wire: chunks v1 lacks, of files v1 lacks.
	have := map[digest.Digest]bool{}
	for _, c := range v1.ChunkDescriptors() {
		have[c.Digest] = true
	}
	same := map[string]digest.Digest{}
	for _, f := range v1.Index.AllFiles() {
		same[f.Path] = f.Digest
	}
	var newBytes int64
	for _, f := range v2.Index.AllFiles() {
		if f.Type != layout.TypeFile || same[f.Path] == f.Digest {
			continue
		}
		for _, e := range f.Extents {
			if c := v2.Chunk(e.Chunk); !have[c.Digest] {
				have[c.Digest] = true
				newBytes += c.Size
			}
		}
	}
	got := fetchedBytes(store, v2)
	t.Logf("fetched %d bytes (%d chunks), copied %d bytes (%d chunks); v2 has %d new bytes of %d", got, res.ChunksFetched, res.BytesCopied, res.ChunksCopied, newBytes, v2.Index.Bytes())
	// At most the chunks v1 lacks (fewer where bytes of a new chunk sit
	// at the same place in v1's file of the same name), at least the file
	// v1 did not have at all.
	if got > newBytes || got < int64(len(f2["new"])) {
		t.Errorf("upgrade fetched %d bytes, want at most the %d bytes of chunks v1 lacks and at least %d", got, newBytes, len(f2["new"]))
	}
	if res.ChunksCopied == 0 {
		t.Error("nothing copied from v1's files")
	}
	if res.FilesRemoved != 1 {
		t.Errorf("removed %d files, want 1 (old)", res.FilesRemoved)
	}
	checkPulled(t, dst, f2, nil)
	if _, err := os.Lstat(filepath.Join(dst, "old")); !os.IsNotExist(err) {
		t.Errorf("old: still there (%v)", err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "mine")); err != nil || string(b) != "user's" {
		t.Errorf("a file no pull wrote was touched: %q, %v", b, err)
	}
	diffs, err := layout.CompareDir(ctx, v2, dst, nil)
	if err != nil || len(diffs) != 1 || diffs[0].Path != "mine" {
		t.Errorf("verify after upgrade: %v, %v", diffs, err)
	}
}

// TestPullUpgradeWithoutState: with no record of an earlier pull, chunks
// at the same place in a file already at the final name are reused after
// their digest is checked; a file whose bytes there differ is fetched.
func TestPullUpgradeWithoutState(t *testing.T) {
	ctx := context.Background()
	store, _, v2, f1, f2 := upgradeVersions(t)
	dst := t.TempDir()
	testutil.WriteTree(t, dst, f1)
	res, err := Materialise(ctx, store, v2, dst, Options{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.ChunksCopied == 0 {
		t.Error("nothing copied from the file already there")
	}
	var changed int64
	for _, c := range v2.ChunkDescriptors() {
		changed += c.Size
	}
	if got := fetchedBytes(store, v2); got >= changed/2 {
		t.Errorf("fetched %d of %d bytes", got, changed)
	}
	checkPulled(t, dst, f2, nil)
	if b, _ := os.ReadFile(filepath.Join(dst, "old")); len(b) == 0 {
		t.Error("a file no pull wrote was removed")
	}
}

// TestPullUpgradeCopiesVouchedChunksUnhashed: chunks in files an earlier
// pull wrote, unchanged since by their stat keys, are copied in the kernel
// without hashing; a file changed since (even with its size and mtime put
// back) is not trusted: its bytes are hashed, and the wrong ones fetched.
func TestPullUpgradeCopiesVouchedChunksUnhashed(t *testing.T) {
	ctx := context.Background()
	p := layout.Params{Min: 16 << 10, Avg: 32 << 10, Max: 64 << 10}
	for _, tamper := range []bool{false, true} {
		store, v1, v2, f1, f2 := upgradeVersions(t)
		s1, _ := pushed(t, p, f1)
		dst := t.TempDir()
		statDir := t.TempDir()
		cache := func() *statcache.Cache {
			c := statcache.Open(filepath.Join(statDir, "statcache"), dst, layout.Params{})
			// As if the record were saved well after the files were
			// written: none of them is racy.
			c.SetTestHooks(func() time.Time { return time.Now().Add(time.Second) }, 0)
			return c
		}
		if _, err := Materialise(ctx, s1, v1, dst, Options{Jobs: 2, StatCache: cache()}); err != nil {
			t.Fatal(err)
		}
		big := filepath.Join(dst, "big.bin")
		if tamper {
			// Same size, same mtime, different bytes in an unchanged chunk.
			st, err := os.Stat(big)
			if err != nil {
				t.Fatal(err)
			}
			b := append([]byte(nil), f1["big.bin"]...)
			b[10] ^= 0xff
			if err := os.WriteFile(big, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(big, st.ModTime(), st.ModTime()); err != nil {
				t.Fatal(err)
			}
		}
		res, err := Materialise(ctx, store, v2, dst, Options{Jobs: 2, StatCache: cache()})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("tamper=%v: copied %d chunks (%d unhashed), fetched %d", tamper, res.ChunksCopied, res.ChunksCopiedUnhashed, res.ChunksFetched)
		checkPulled(t, dst, f2, nil)
		// The chunks v1's files hold that v2's changed files need: the
		// record says where they are.
		inV1 := map[digest.Digest]bool{}
		for _, c := range v1.ChunkDescriptors() {
			inV1[c.Digest] = true
		}
		sameFile := map[string]digest.Digest{}
		for _, f := range v1.Index.AllFiles() {
			sameFile[f.Path] = f.Digest
		}
		recorded := map[digest.Digest]bool{}
		for _, f := range v2.Index.AllFiles() {
			if f.Type != layout.TypeFile || sameFile[f.Path] == f.Digest {
				continue
			}
			for _, e := range f.Extents {
				if c := v2.Chunk(e.Chunk); inV1[c.Digest] {
					recorded[c.Digest] = true
				}
			}
		}
		if !tamper && (len(recorded) == 0 || res.ChunksCopiedUnhashed != int64(len(recorded))) {
			t.Errorf("%d chunks copied unhashed, want the %d that v1's recorded files hold", res.ChunksCopiedUnhashed, len(recorded))
		}
		if tamper {
			if res.ChunksCopiedUnhashed != 0 {
				t.Errorf("%d chunks copied unhashed from a file changed since the pull that recorded it", res.ChunksCopiedUnhashed)
			}
			if res.ChunksCopied == 0 {
				t.Error("nothing copied (hashed) from the tampered file's intact chunks")
			}
			if fetchedBytes(store, v2) == 0 {
				t.Error("the tampered chunk was not fetched")
			}
		}
	}
}

// TestPullUpgradeNoGuessesOverRecords: where an earlier pull's record says
// what a file holds (big.bin, rewritten in the middle by v2), the chunks
// of the rewritten bytes are fetched at once, not first looked for at the
// same place in the old file and hashed; without a record they are looked
// for there, found missing and fetched.
func TestPullUpgradeNoGuessesOverRecords(t *testing.T) {
	ctx := context.Background()
	store, v1, v2, f1, f2 := upgradeVersions(t)
	s1, _ := pushed(t, layout.Params{Min: 16 << 10, Avg: 32 << 10, Max: 64 << 10}, f1)
	dst := t.TempDir()
	statDir := t.TempDir()
	cache := func() *statcache.Cache {
		c := statcache.Open(filepath.Join(statDir, "statcache"), dst, layout.Params{})
		c.SetTestHooks(func() time.Time { return time.Now().Add(time.Second) }, 0) // no record is racy
		return c
	}
	if _, err := Materialise(ctx, s1, v1, dst, Options{Jobs: 2, StatCache: cache()}); err != nil {
		t.Fatal(err)
	}
	res, err := Materialise(ctx, store, v2, dst, Options{Jobs: 2, StatCache: cache()})
	if err != nil {
		t.Fatal(err)
	}
	if res.LocalMisses != 0 {
		t.Errorf("%d chunks looked for in place and fetched after all; the record says they are not there", res.LocalMisses)
	}
	if res.ChunksCopied == 0 || res.ChunksFetched == 0 {
		t.Errorf("copied %d chunks, fetched %d: want both", res.ChunksCopied, res.ChunksFetched)
	}
	checkPulled(t, dst, f2, nil)

	// No record: the same upgrade looks in place, and misses.
	bare := t.TempDir()
	testutil.WriteTree(t, bare, f1)
	res, err = Materialise(ctx, store, v2, bare, Options{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.LocalMisses == 0 {
		t.Error("no chunk looked for in place was missing: the rewritten bytes were not looked for")
	}
	checkPulled(t, bare, f2, nil)
}
