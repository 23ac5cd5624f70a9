package retention

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

func TestRemoveRefusesANeededVersionUnlessForced(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	v := threeVersions(t, r)
	ref := oci.Ref{Layout: r.dir, Tag: "v1"}
	d := v[0].Root.Digest
	sources := func(context.Context) ([]Reference, error) {
		return []Reference{{Source: "k8s.yaml:7", Ref: "x@" + d.String(), Digest: d}}, nil
	}
	_, err := Remove(ctx, ref, oci.Options{}, RemoveOptions{Sources: sources})
	if !errors.Is(err, ErrStillNeeded) || !strings.Contains(err.Error(), ref.Pinned(d)+" is still needed: ") || !strings.Contains(err.Error(), "k8s.yaml:7") {
		t.Fatalf("Remove of a referenced version = %v", err)
	}
	if !slices.Contains(r.list(t), d) {
		t.Fatal("a refused removal deleted the version")
	}
	rm, err := Remove(ctx, ref, oci.Options{}, RemoveOptions{Sources: sources, Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if rm.Digest != d || rm.Pinned != ref.Pinned(d) || rm.Tombstone == "" || !slices.Equal(rm.Tags, []string{"v1"}) ||
		len(rm.Views) != 0 || rm.ViewsErr != nil {
		t.Fatalf("removed %+v", rm)
	}
	if slices.Contains(r.list(t), d) {
		t.Fatal("the version is still listed")
	}
	if ds := r.deleted(t); len(ds) != 1 || ds[0].Digest != d || ds[0].Tag != rm.Tombstone {
		t.Fatalf("tombstones %+v", ds)
	}
	// Again, by digest: it is not live any more.
	byDigest := oci.Ref{Layout: r.dir, Digest: d}
	if _, err := Remove(ctx, byDigest, oci.Options{}, RemoveOptions{}); !errors.Is(err, ErrNotLive) || !strings.HasPrefix(err.Error(), ref.Pinned(d)+": ") {
		t.Errorf("second Remove = %v", err)
	}
	// An unreferenced version goes without Force.
	if _, err := Remove(ctx, oci.Ref{Layout: r.dir, Tag: "v2"}, oci.Options{}, RemoveOptions{Sources: sources}); err != nil {
		t.Errorf("Remove of an unreferenced version: %v", err)
	}
	r.intact(t, v[2])
}

func TestRestoreRefBringsARemovedVersionBack(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	v := threeVersions(t, r)
	d := v[0].Root.Digest
	ref := oci.Ref{Layout: r.dir, Digest: d}
	if _, _, err := RestoreRef(ctx, ref, oci.Options{}); !errors.Is(err, ErrNoTombstone) ||
		!strings.HasPrefix(err.Error(), ref.Pinned(d)+": ") {
		t.Fatalf("restore of a live version: %v", err)
	}
	if _, err := Remove(ctx, ref, oci.Options{}, RemoveOptions{}); err != nil {
		t.Fatal(err)
	}
	tag, warn, err := RestoreRef(ctx, ref, oci.Options{})
	if err != nil || warn != nil || tag == "" {
		t.Fatalf("RestoreRef = %q, %v, %v", tag, warn, err)
	}
	if !slices.Contains(r.list(t), d) {
		t.Fatal("the restored version is not listed")
	}
	if d2, err := r.t.Resolve(ctx, tag); err != nil || d2.Digest != d {
		t.Errorf("protective tag %s = %v, %v", tag, d2.Digest, err)
	}
	r.intact(t, v[0])
}
