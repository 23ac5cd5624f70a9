package pull

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// TestUpgradeLooksOnlyAtChangedPieces: an upgrade over a whole pull of
// the version before looks only at the files of the index pieces that
// changed; the files of the others are kept on that pull's records
// unopened (a change made behind bdnvol's back there stays, which shows
// they were not looked at). After a partial pull, every file is looked at
// again.
func TestUpgradeLooksOnlyAtChangedPieces(t *testing.T) {
	ctx := context.Background()
	f1 := map[string][]byte{}
	for i := range 3000 {
		f1[fmt.Sprintf("d/f%04d", i)] = testutil.RandBytes(uint64(i), 64)
	}
	f2 := map[string][]byte{}
	for k, v := range f1 {
		f2[k] = v
	}
	f2["d/f2900"] = testutil.RandBytes(9999, 64)
	p := layout.Params{Min: 4 << 10, Avg: 8 << 10, Max: 16 << 10, Pack: 4 << 10}
	s1, v1 := pushed(t, p, f1)
	s2, v2 := pushed(t, p, f2)
	if len(v2.Index.Pieces()) < 3 {
		t.Fatalf("premise: %d index pieces, want several", len(v2.Index.Pieces()))
	}
	dst, statDir := t.TempDir(), t.TempDir()
	later := func() time.Time { return time.Now().Add(time.Second) } // no record racy
	pullSel := func(src *layout.Version, sel func(string) bool) *Result {
		t.Helper()
		c := statcache.Open(statDir, dst, layout.Params{})
		c.SetTestHooks(later, 0)
		store := s1
		if src == v2 {
			store = s2
		}
		res, err := Materialise(ctx, store, src, dst, Options{Jobs: 2, StatCache: c, Select: sel})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	pull := func(v *layout.Version, _ any) *Result { t.Helper(); return pullSel(v, nil) }
	pull(v1, nil)
	tampered := filepath.Join(dst, "d", "f0000")
	if err := os.WriteFile(tampered, bytes.Repeat([]byte("x"), 64), 0o644); err != nil {
		t.Fatal(err)
	}
	res := pull(v2, nil)
	inChanged := changedPieceEntries(v1.Index, v2.Index)
	if res.FilesUnlooked != 3000-inChanged || inChanged == 0 || inChanged > 2048 {
		t.Errorf("upgrade kept %d files unlooked; want the %d outside the changed piece", res.FilesUnlooked, 3000-inChanged)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "d", "f2900")); !bytes.Equal(b, f2["d/f2900"]) {
		t.Error("the changed file was not written")
	}
	if b, _ := os.ReadFile(tampered); !bytes.Equal(b, bytes.Repeat([]byte("x"), 64)) {
		t.Error("a file of an unchanged piece was looked at (its change behind bdnvol's back was undone)")
	}
	// A partial pull changes the tree without saving the pieces: after it
	// a whole pull looks at every file again.
	pullSel(v2, func(p string) bool { return p == "d/f0001" })
	if res := pull(v2, nil); res.FilesUnlooked != 0 {
		t.Errorf("after a push saved the cache, %d files kept unlooked", res.FilesUnlooked)
	}
	if b, _ := os.ReadFile(tampered); !bytes.Equal(b, f2["d/f0000"]) {
		t.Error("a pull that looked at every file left the changed one")
	}
}

// changedPieceEntries counts the entries of y's pieces that x lacks.
func changedPieceEntries(x, y *layout.Index) int {
	had := map[string]bool{}
	for _, pc := range x.Pieces() {
		had[pc.Digest.String()] = true
	}
	n := 0
	for _, pc := range y.Pieces() {
		if !had[pc.Digest.String()] {
			n += int(pc.Entries)
		}
	}
	return n
}
