package retention

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
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

// TestGCDropsUnusedCompanions: with DropUnusedCompanions, GC plans the
// companions of kept versions that no warm-state volume among the
// references uses (a volume that leaves out the node's fields uses the
// companions of every node's), deletes them only with Apply, and leaves
// the used ones; without it, no companion is touched.
func TestGCDropsUnusedCompanions(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	vs := threeVersions(t, r)
	ref := oci.Ref{Layout: r.dir}
	publish := func(v *push.Result, key string) warmstate.Companion {
		t.Helper()
		cache := t.TempDir()
		if err := os.WriteFile(filepath.Join(cache, "kernel.bin"), []byte("kernel for "+key), 0o644); err != nil {
			t.Fatal(err)
		}
		k, err := warmstate.ParseKey(key)
		if err != nil {
			t.Fatal(err)
		}
		p, err := warmstate.Publish(ctx, r.t, v.Root, k, push.DirSource(cache), warmstate.PublishOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Companion
	}
	h100 := publish(vs[0], "engine=vllm,tp=1,gpu=H100,driver=550")
	a100 := publish(vs[0], "engine=vllm,tp=1,gpu=A100,driver=535")
	tp2 := publish(vs[0], "engine=vllm,tp=2,gpu=H100,driver=550")
	prod := publish(vs[2], "engine=vllm,tp=1")
	v2 := publish(vs[1], "engine=triton")
	// A pod of v1 by digest whose key leaves the node's fields out, and a
	// Deployment of v3 by its tag "prod".
	deploy := fmt.Sprintf(`apiVersion: v1
kind: Pod
spec:
  volumes:
    - name: weights
      csi: {driver: csi.bdnvol.dev, volumeAttributes: {ref: "%[1]s@%[2]s"}}
    - name: cache
      csi:
        driver: csi.bdnvol.dev
        volumeAttributes:
          ref: "%[1]s@%[2]s"
          warmstateKey: "TP=1, engine=vllm"
---
{"kind": "Deployment", "spec": {"template": {"spec": {"volumes": [{"csi": {"volumeAttributes": {"ref": "%[1]s:prod", "warmstateKey": "engine=vllm,tp=1"}}}]}}}}
`, ref.String(), vs[0].Root.Digest)
	refs := Scan(ref, "deploy.yaml", []byte(deploy))
	var keyed []Reference
	for _, r := range refs {
		if r.WarmstateKey != "" {
			keyed = append(keyed, r)
		}
	}
	if len(keyed) != 2 || keyed[0].WarmstateKey != "engine=vllm,tp=1" || keyed[0].Digest != vs[0].Root.Digest || keyed[1].Tag != "prod" {
		t.Fatalf("warm-state volumes scanned: %+v", keyed)
	}
	sources := func(context.Context) ([]Reference, error) { return refs, nil }
	policy := Policy{KeepLast: 3}
	count := func(v *push.Result) int {
		t.Helper()
		cs, err := warmstate.List(ctx, r.t, v.Root)
		if err != nil {
			t.Fatal(err)
		}
		return len(cs)
	}

	rep, err := GC(ctx, ref, oci.Options{}, GCOptions{Policy: policy, Sources: sources, Apply: true})
	if err != nil || len(rep.Companions) != 0 || count(vs[0]) != 3 || count(vs[1]) != 1 {
		t.Fatalf("GC without DropUnusedCompanions: %v, %+v", err, rep)
	}
	rep, err = GC(ctx, ref, oci.Options{}, GCOptions{Policy: policy, Sources: sources, DropUnusedCompanions: true})
	if err != nil {
		t.Fatal(err)
	}
	var planned []string
	for _, d := range rep.Companions {
		planned = append(planned, d.Companion.String())
	}
	slices.Sort(planned)
	want := []string{tp2.Desc.Digest.String(), v2.Desc.Digest.String()}
	slices.Sort(want)
	if !slices.Equal(planned, want) || count(vs[0]) != 3 {
		t.Fatalf("dry run plans %v, want %v (tp=2 of v1, v2's unreferenced)", planned, want)
	}
	rep, err = GC(ctx, ref, oci.Options{}, GCOptions{Policy: policy, Sources: sources, DropUnusedCompanions: true, Apply: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range rep.Companions {
		if !d.Done {
			t.Errorf("companion %s not deleted: %s", d.Companion, d.Error)
		}
	}
	for _, c := range []warmstate.Companion{h100, a100, prod} {
		if ok, _ := r.t.Exists(ctx, c.Desc); !ok {
			t.Errorf("used companion %s (%s) deleted", c.Desc.Digest, c.Key)
		}
	}
	for _, c := range []warmstate.Companion{tp2, v2} {
		if ok, _ := r.t.Exists(ctx, c.Desc); ok {
			t.Errorf("unused companion %s (%s) kept", c.Desc.Digest, c.Key)
		}
	}
	if count(vs[0]) != 2 || count(vs[1]) != 0 || count(vs[2]) != 1 || len(r.list(t)) != 3 {
		t.Fatalf("after GC: %d, %d, %d companions, %d versions", count(vs[0]), count(vs[1]), count(vs[2]), len(r.list(t)))
	}
}
