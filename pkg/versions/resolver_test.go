package versions

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/deploy"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

var _ deploy.Resolver = (*Resolver)(nil)

func TestResolverResolvesEachReferenceOnce(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "vol")
	tg, err := oci.Open(ctx, oci.Ref{Layout: dir}, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	vs := threeVersions(t, tg)
	r := NewResolver(oci.Options{})
	ref, err := oci.ParseRef("oci:" + dir + ":prod")
	if err != nil {
		t.Fatal(err)
	}
	d, err := r.Resolve(ctx, ref)
	if err != nil || d != vs[2].Root.Digest {
		t.Fatalf("prod resolves to %s (%v), want %s", d, err, vs[2].Root.Digest)
	}
	// The tag moves; the resolver answers as it did the first time.
	if err := tg.Tag(ctx, vs[0].Root, "prod"); err != nil {
		t.Fatal(err)
	}
	if d, err := r.Resolve(ctx, ref); err != nil || d != vs[2].Root.Digest {
		t.Errorf("second resolve of prod: %s (%v); want the first answer, %s", d, err, vs[2].Root.Digest)
	}
	if d, err := NewResolver(oci.Options{}).Resolve(ctx, ref); err != nil || d != vs[0].Root.Digest {
		t.Errorf("a new resolver: prod is %s (%v), want %s", d, err, vs[0].Root.Digest)
	}
	missing, _ := oci.ParseRef("oci:" + dir + ":nothing")
	if _, err := r.Resolve(ctx, missing); !errors.Is(err, oci.ErrNotFound) {
		t.Errorf("a missing tag: %v; want ErrNotFound", err)
	}
	if has, err := r.HasVolumes(ctx, ref); err != nil || !has {
		t.Errorf("HasVolumes of a repository with versions: %v, %v", has, err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if _, err := oci.Open(ctx, oci.Ref{Layout: empty}, oci.Options{CreateLayout: true}); err != nil {
		t.Fatal(err)
	}
	eref, _ := oci.ParseRef("oci:" + empty + ":x")
	if has, err := r.HasVolumes(ctx, eref); err != nil || has {
		t.Errorf("HasVolumes of an empty layout: %v, %v", has, err)
	}
}

func TestResolveTagsLeavesOutMissing(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	vs := threeVersions(t, tg)
	got, err := ResolveTags(ctx, tg, []string{"v1", "prod", "nothing"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["v1"].Digest != vs[0].Root.Digest || got["prod"].Digest != vs[2].Root.Digest {
		t.Errorf("resolved %v", got)
	}
}
