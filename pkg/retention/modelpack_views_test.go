package retention

import (
	"context"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/modelpack"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// TestApplyDeletesModelPackViews: gc --apply deletes the ModelPack views
// of the versions it deletes, beside their image views, and keeps those of
// the versions it keeps.
func TestApplyDeletesModelPackViews(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	now := time.Now()
	old := r.push(t, map[string][]byte{"a": testutil.Pattern(1, 50<<10)}, now.Add(-time.Hour), 0)
	cur := r.push(t, map[string][]byte{"a": testutil.Pattern(2, 50<<10)}, now, 0)
	for _, res := range []*push.Result{old, cur} {
		ver, err := layout.Open(ctx, r.t, res.Root)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := modelpack.BuildView(ctx, r.t, ver, []imageview.Dest{r.t}); err != nil {
			t.Fatal(err)
		}
	}
	ver, err := layout.Open(ctx, r.t, old.Root)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := imageview.Build(ctx, r.t, ver, []imageview.Dest{r.t}, imageview.Options{}); err != nil {
		t.Fatal(err)
	}
	snapshot, err := versions.List(ctx, r.t)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := NewPlan(Input{Versions: snapshot, Now: now}, Policy{KeepLast: 1})
	if err != nil {
		t.Fatal(err)
	}
	results, err := Apply(ctx, r.t, plan, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 1 || results[0].Digest != old.Root.Digest || results[0].ImageViews != 2 || results[0].Warning != "" {
		t.Fatalf("results %+v: want the old version deleted with its image view and its ModelPack view", results)
	}
	if vs, err := modelpack.Views(ctx, r.t, old.Root.Digest); err != nil || len(vs) != 0 {
		t.Errorf("ModelPack views of the deleted version: %v, %v", vs, err)
	}
	if vs, err := modelpack.Views(ctx, r.t, cur.Root.Digest); err != nil || len(vs) != 1 {
		t.Errorf("ModelPack views of the kept version: %v, %v: want 1", vs, err)
	}
}
