package retention

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/signature"
	"github.com/bdnvol/bdnvol/pkg/warmstate"
)

// TestPurgeTakesCompanions: a version's warm-state companions stay while
// it is soft-deleted (a restore brings its caches back) and through a
// sweep of the layout, and are deleted when it is purged.
func TestPurgeTakesCompanions(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	vs := threeVersions(t, r)
	v := vs[0]
	cache := t.TempDir()
	if err := os.WriteFile(filepath.Join(cache, "kernel.bin"), []byte("compiled kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	key, err := warmstate.ParseKey("engine=vllm,tp=1")
	if err != nil {
		t.Fatal(err)
	}
	p, err := warmstate.Publish(ctx, r.t, v.Root, key, push.DirSource(cache), warmstate.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := SoftDelete(ctx, r.t, v.Root.Digest, DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := SweepLayout(ctx, r.dir, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := warmstate.Find(ctx, r.t, v.Root, key, signature.Policy{}); err != nil {
		t.Fatalf("companion of a soft-deleted version: %v", err)
	}
	if _, err := layout.Open(ctx, r.t, p.Companion.Tree); err != nil {
		t.Fatalf("companion tree after a sweep: %v", err)
	}
	if err := Purge(ctx, r.t, r.deleted(t)[0], PurgeOptions{}); err != nil {
		t.Fatal(err)
	}
	cs, err := warmstate.List(ctx, r.t, v.Root)
	if err != nil || len(cs) != 0 {
		t.Fatalf("companions after the purge: %v, %d left", err, len(cs))
	}
	if ok, _ := r.t.Exists(ctx, p.Companion.Desc); ok {
		t.Fatalf("companion %s still stored", p.Companion.Desc.Digest)
	}
	r.intact(t, vs[1])
}
