package retention

import (
	"context"
	"fmt"
	"slices"
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
	// DropUnusedCompanions also plans, and with Apply deletes, the
	// warm-state companions of kept versions that no warm-state volume
	// among the references uses (docs/warm-state.md).
	DropUnusedCompanions bool
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
	// Companions are the unused warm-state companions of kept versions
	// (DropUnusedCompanions).
	Companions []CompanionDrop `json:"companions,omitempty"`
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
	if opt.DropUnusedCompanions {
		if rep.Companions, err = unusedCompanions(ctx, t, plan, in.References); err != nil {
			return nil, err
		}
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
	if len(rep.Companions) > 0 && err == nil {
		// The references read again: a volume of a key deployed since the
		// plan keeps its companion.
		refs, rerr := opt.Sources(ctx)
		if rerr != nil {
			return rep, rerr
		}
		again, rerr := unusedCompanions(ctx, t, plan, refs)
		if rerr != nil {
			return rep, rerr
		}
		rep.Companions = slices.DeleteFunc(rep.Companions, func(d CompanionDrop) bool {
			return !slices.ContainsFunc(again, func(a CompanionDrop) bool { return a.Companion == d.Companion })
		})
		err = dropCompanions(ctx, t, rep.Companions)
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
