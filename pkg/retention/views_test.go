package retention

import (
	"context"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// TestApplyDeletesImageViews: gc --apply deletes the image views of the
// versions it deletes, and only those.
func TestApplyDeletesImageViews(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	now := time.Now()
	old := r.push(t, map[string][]byte{"a": testutil.Pattern(1, 50<<10)}, now.Add(-time.Hour), 0)
	cur := r.push(t, map[string][]byte{"a": testutil.Pattern(2, 50<<10)}, now, 0)
	view := func(res *push.Result) {
		ver, err := layout.Open(ctx, r.t, res.Root)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := imageview.Build(ctx, r.t, ver, []imageview.Dest{r.t}, imageview.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	view(old)
	view(cur)
	snapshot, err := versions.List(ctx, r.t)
	if err != nil {
		t.Fatal(err)
	}
	var in []versions.Version
	for _, v := range snapshot {
		in = append(in, v)
	}
	plan, err := NewPlan(Input{Versions: in, Now: now}, Policy{KeepLast: 1})
	if err != nil {
		t.Fatal(err)
	}
	results, err := Apply(ctx, r.t, plan, ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 1 || results[0].Digest != old.Root.Digest || results[0].ImageViews != 1 || results[0].Warning != "" {
		t.Fatalf("results %+v: want the old version deleted with its one view", results)
	}
	if vs, err := imageview.List(ctx, r.t, old.Root.Digest); err != nil || len(vs) != 0 {
		t.Errorf("views of the deleted version: %v, %v", vs, err)
	}
	if vs, err := imageview.List(ctx, r.t, cur.Root.Digest); err != nil || len(vs) != 1 {
		t.Errorf("views of the kept version: %v, %v: want 1", vs, err)
	}
}
