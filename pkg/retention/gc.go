package retention

import (
	"context"
	"fmt"
	"time"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// GCOptions configure GC.
type GCOptions struct {
	Policy  Policy
	Sources Sources
	// Apply carries the plan out; without it GC only plans.
	Apply bool
	// BlobGrace: with Apply and Policy.Purge, an OCI layout's unreachable
	// blobs younger than this are left (a push may be running).
	BlobGrace time.Duration
	// Planned (if set) is told of the plan before any of it is carried out.
	Planned func(*Plan)
	// OnResult (if set) is told of each version and tombstone as it is
	// deleted, purged or kept after all.
	OnResult func(Result)
}

// GCReport is what GC planned and did.
type GCReport struct {
	Repository string      `json:"repository"`
	Applied    bool        `json:"applied"`
	Plan       *Plan       `json:"plan"`
	Results    []Result    `json:"results,omitempty"`
	Swept      *Swept      `json:"swept,omitempty"`
	References []Reference `json:"references"`
}

// GC plans the deletion of the versions of the repository ref names that
// the policy and no reference keeps, and with Apply carries it out: soft
// deletes, purges, and for an OCI layout with Policy.Purge a sweep of
// unreachable blobs. A layout stays locked while GC changes it. The report
// is nil when no plan could be made; otherwise it comes with the first
// error of carrying the plan out.
func GC(ctx context.Context, ref oci.Ref, ociOpt oci.Options, opt GCOptions) (*GCReport, error) {
	t, unlock, err := oci.OpenLocked(ctx, ref, ociOpt, opt.Apply)
	if err != nil {
		return nil, err
	}
	defer unlock()
	in, err := Snapshot(ctx, t, opt.Sources)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref.Repo(), err)
	}
	plan, err := NewPlan(in, opt.Policy)
	if err != nil {
		return nil, err
	}
	rep := &GCReport{Repository: ref.Repo(), Applied: opt.Apply, Plan: plan, References: in.References}
	if rep.References == nil {
		rep.References = []Reference{}
	}
	if opt.Planned != nil {
		opt.Planned(plan)
	}
	if !opt.Apply {
		return rep, nil
	}
	results, err := Apply(ctx, t, plan, ApplyOptions{Sources: opt.Sources, OnResult: opt.OnResult})
	rep.Results = results
	if rep.Results == nil {
		rep.Results = []Result{}
	}
	if ref.Layout != "" && opt.Policy.Purge && err == nil {
		sw, serr := SweepLayout(ctx, ref.Layout, opt.BlobGrace)
		if serr != nil {
			return rep, fmt.Errorf("sweep %s: %w", ref.Repo(), serr)
		}
		rep.Swept = &sw
	}
	return rep, err
}
