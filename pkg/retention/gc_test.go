package retention

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

func TestGCPlansThenAppliesAndPurges(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	v := threeVersions(t, r)
	ref := oci.Ref{Layout: r.dir}
	// v1 is referenced by a deploy file: kept whatever the policy says.
	sources := func(context.Context) ([]Reference, error) {
		return []Reference{{Source: "deploy.yaml:3", Ref: "x@" + v[0].Root.Digest.String(), Digest: v[0].Root.Digest}}, nil
	}
	policy := Policy{KeepLast: 1}
	planned := 0
	rep, err := GC(ctx, ref, oci.Options{}, GCOptions{Policy: policy, Sources: sources, Planned: func(*Plan) { planned++ }})
	if err != nil {
		t.Fatal(err)
	}
	if planned != 1 || rep.Applied || rep.Results != nil || len(rep.References) != 1 || rep.Repository != ref.Repo() {
		t.Fatalf("dry run: planned %d, report %+v", planned, rep)
	}
	var deletes []string
	for _, d := range rep.Plan.Versions {
		if d.Action == ActionDelete {
			deletes = append(deletes, d.Digest.String())
		}
	}
	if len(deletes) != 1 || deletes[0] != v[1].Root.Digest.String() || len(r.list(t)) != 3 {
		t.Fatalf("plan deletes %q (want only v2); %d versions left", deletes, len(r.list(t)))
	}
	// The JSON of a dry run has no results but does have references.
	b, _ := json.Marshal(rep)
	if strings.Contains(string(b), `"results"`) || !strings.Contains(string(b), `"references":[{`) {
		t.Errorf("dry-run JSON %s", b)
	}

	var done []Result
	rep, err = GC(ctx, ref, oci.Options{}, GCOptions{Policy: policy, Sources: sources, Apply: true, OnResult: func(r Result) { done = append(done, r) }})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Applied || len(rep.Results) != 1 || len(done) != 1 || !done[0].Done || done[0].Digest != v[1].Root.Digest || rep.Swept != nil {
		t.Fatalf("apply: results %+v, told %+v, swept %v", rep.Results, done, rep.Swept)
	}
	if left := r.list(t); len(left) != 2 || slices.Contains(left, v[1].Root.Digest) {
		t.Fatalf("versions after apply: %v", left)
	}
	r.intact(t, v[0])
	r.intact(t, v[2])

	// With --purge and no restore window, the tombstone goes and the
	// layout's unreachable blobs are swept.
	before := blobBytes(t, r.dir)
	rep, err = GC(ctx, ref, oci.Options{}, GCOptions{Policy: Policy{KeepLast: 1, Purge: true}, Sources: sources, Apply: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Swept == nil || rep.Swept.Blobs == 0 || blobBytes(t, r.dir) >= before || len(r.deleted(t)) != 0 {
		t.Fatalf("purge: swept %+v, blob bytes %d -> %d, tombstones %d", rep.Swept, before, blobBytes(t, r.dir), len(r.deleted(t)))
	}
	r.intact(t, v[0])
	r.intact(t, v[2])
}

func TestGCOfAMissingLayoutMakesNoReport(t *testing.T) {
	ref := oci.Ref{Layout: t.TempDir() + "/none"}
	for _, apply := range []bool{false, true} {
		rep, err := GC(context.Background(), ref, oci.Options{}, GCOptions{Policy: Policy{KeepLast: 1}, Apply: apply,
			Sources: func(context.Context) ([]Reference, error) { return nil, nil }})
		if rep != nil || err == nil || !strings.Contains(err.Error(), "none") {
			t.Errorf("apply %v: report %+v, err %v", apply, rep, err)
		}
	}
}
