package warm

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
)

// TestWarmRecordsItsOrigin: a fill records the warmed version's repository
// as the origin of its chunks, so the version counts as cached for that
// repository and not for another holding the same chunks, until that one
// is warmed too (chunkcache's origin rule).
func TestWarmRecordsItsOrigin(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	testutil.WriteTree(t, filepath.Join(dir, "tree"), map[string][]byte{"a.bin": testutil.RandBytes(7, 300<<10)})
	var refs []string
	for _, name := range []string{"one", "two"} {
		r, _ := pushTree(t, filepath.Join(dir, "tree"), filepath.Join(dir, name))
		refs = append(refs, r)
	}
	cache, err := chunkcache.Open(filepath.Join(dir, "cache"), 0)
	if err != nil {
		t.Fatal(err)
	}
	one, err := Open(ctx, cache, refs[0], "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	two, err := Open(ctx, cache, refs[1], "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := one.Fill(ctx, cache, FillOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, missing := cachedOf(cache, one); missing != 0 || b != one.Bytes() {
		t.Fatalf("after warming: %d bytes cached, %d chunks missing, want all of %d", b, missing, one.Bytes())
	}
	if b, missing := cachedOf(cache, two); missing != len(two.Need) || b != 0 {
		t.Errorf("another repository with the same chunks: %d bytes cached, %d of %d missing, want none cached", b, missing, len(two.Need))
	}
	if err := two.Fill(ctx, cache, FillOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*Opened{one, two} {
		if _, missing := cachedOf(cache, p); missing != 0 {
			t.Errorf("%s: %d chunks missing after both were warmed", p.Ref, missing)
		}
	}
}
