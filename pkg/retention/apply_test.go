package retention

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/pull"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

var smallParams = layout.Params{Min: 4 << 10, Avg: 16 << 10, Max: 64 << 10}

type repo struct {
	dir string
	t   oci.Target
}

func openLayout(t *testing.T) repo {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "vol")
	tg, err := oci.Open(context.Background(), oci.Ref{Layout: dir}, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	return repo{dir: dir, t: tg}
}

// push seals files as a version sealed at sealed, with tags.
func (r repo) push(t *testing.T, files map[string][]byte, sealed time.Time, maxLayers int, tags ...string) *push.Result {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	for p, b := range files {
		if err := os.WriteFile(filepath.Join(dir, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res, err := push.Push(ctx, r.t, push.DirSource(dir), push.Options{Params: smallParams, MaxLayers: maxLayers})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oci.TagVersion(ctx, r.t, res.Root, res.RootBytes, tags, sealed); err != nil {
		t.Fatal(err)
	}
	return res
}

func (r repo) list(t *testing.T) []digest.Digest {
	t.Helper()
	vs, err := versions.List(context.Background(), r.t)
	if err != nil {
		t.Fatal(err)
	}
	var out []digest.Digest
	for _, v := range vs {
		out = append(out, v.Digest)
	}
	return out
}

func (r repo) deleted(t *testing.T) []Deleted {
	t.Helper()
	ds, err := ListDeleted(context.Background(), r.t)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// intact checks that every byte of version v can be read and verified.
func (r repo) intact(t *testing.T, v *push.Result) {
	t.Helper()
	ctx := context.Background()
	ver, err := layout.Open(ctx, r.t, v.Root)
	if err != nil {
		t.Fatalf("version %s: %v", v.Root.Digest, err)
	}
	if _, err := pull.Materialise(ctx, r.t, ver, t.TempDir(), pull.Options{}); err != nil {
		t.Fatalf("pull %s: %v", v.Root.Digest, err)
	}
}

func blobBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.Walk(filepath.Join(dir, "blobs"), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func threeVersions(t *testing.T, r repo) [3]*push.Result {
	shared := testutil.Pattern(1, 200<<10)
	v1 := r.push(t, map[string][]byte{"a.bin": shared, "u.bin": testutil.Pattern(11, 100<<10)}, t0, 0, "v1")
	v2 := r.push(t, map[string][]byte{"a.bin": shared, "u.bin": testutil.Pattern(12, 100<<10)}, t0.Add(time.Minute), 0, "v2")
	v3 := r.push(t, map[string][]byte{"a.bin": shared, "u.bin": testutil.Pattern(13, 100<<10)}, t0.Add(2*time.Minute), 0, "v3", "prod")
	return [3]*push.Result{v1, v2, v3}
}

func TestSoftDeleteRestore(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	vs := threeVersions(t, r)
	d1 := vs[0].Root.Digest
	when := t0.Add(time.Hour)
	var checked []string
	rec, err := SoftDelete(ctx, r.t, d1, DeleteOptions{Now: when, Check: func(_ context.Context, tags []string) error {
		checked = tags
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(checked, []string{"v1"}) || rec.Tag != DeletedTag(d1, when) || !slices.Equal(rec.Tags, []string{"v1"}) {
		t.Fatalf("record %+v, checked tags %v", rec, checked)
	}
	if got := r.list(t); slices.Contains(got, d1) || len(got) != 2 {
		t.Fatalf("versions after delete: %v", got)
	}
	if _, err := versions.Resolve(ctx, r.t, oci.Ref{Tag: "v1"}); !errors.Is(err, layout.ErrNotVolume) {
		t.Errorf("v1 should no longer name a version: %v", err)
	}
	ds := r.deleted(t)
	if len(ds) != 1 || ds[0].Digest != d1 || !ds[0].Deleted.Equal(when) || !ds[0].Sealed.Equal(t0) ||
		!slices.Equal(ds[0].Tags, []string{"v1"}) || ds[0].Bytes != vs[0].Bytes || ds[0].Live || ds[0].Gone {
		t.Fatalf("deleted: %+v", ds)
	}
	// Still whole: the tombstone keeps it reachable.
	r.intact(t, vs[0])
	// Deleting it again: not live.
	if _, err := SoftDelete(ctx, r.t, d1, DeleteOptions{}); !errors.Is(err, ErrNotLive) {
		t.Errorf("second delete: %v", err)
	}
	// A check that refuses stops the delete before anything changes.
	refuse := errors.New("no")
	if _, err := SoftDelete(ctx, r.t, vs[1].Root.Digest, DeleteOptions{Check: func(context.Context, []string) error { return refuse }}); !errors.Is(err, refuse) {
		t.Errorf("refused delete: %v", err)
	}
	if len(r.list(t)) != 2 {
		t.Error("a refused delete changed the versions")
	}

	restoredAt := t0.Add(2 * time.Hour)
	tag, warn, err := Restore(ctx, r.t, d1, restoredAt)
	if err != nil || warn != nil {
		t.Fatal(err, warn)
	}
	if tag != oci.ProtectiveTag(d1, restoredAt) {
		t.Errorf("restore tag %s", tag)
	}
	all, err := versions.List(ctx, r.t)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 3 || all[0].Digest != d1 || len(all[0].Tags) != 0 || !all[0].Sealed.Equal(restoredAt) {
		t.Fatalf("after restore: %+v", all)
	}
	if len(r.deleted(t)) != 0 {
		t.Error("tombstone left after restore")
	}
	if _, err := t2r(r.t.Resolve(ctx, "v1")); err == nil {
		t.Error("old human tag survived the restore")
	}
	r.intact(t, vs[0])
	if _, _, err := Restore(ctx, r.t, d1, restoredAt); !errors.Is(err, ErrNoTombstone) {
		t.Errorf("restore of a live version: %v", err)
	}
}

func t2r(d ocispec.Descriptor, err error) (ocispec.Descriptor, error) { return d, err }

func TestPurgeAndSweep(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	vs := threeVersions(t, r)
	// v4 is a root index of parts (3 layers per part).
	v4 := r.push(t, map[string][]byte{"a.bin": testutil.Pattern(1, 200<<10), "w.bin": testutil.Pattern(14, 300<<10)}, t0.Add(3*time.Minute), 3)
	if v4.Root.MediaType != ocispec.MediaTypeImageIndex {
		t.Fatalf("v4 root is %s", v4.Root.MediaType)
	}
	before := blobBytes(t, r.dir)
	unique := uniqueBytes(t, r, []*push.Result{vs[0], v4}, []*push.Result{vs[1], vs[2]})
	for _, v := range []*push.Result{vs[0], v4} {
		if _, err := SoftDelete(ctx, r.t, v.Root.Digest, DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Soft-deleted versions survive a sweep.
	if sw, err := SweepLayout(ctx, r.dir, 0); err != nil || sw.Blobs != 0 {
		t.Fatalf("sweep before purge: %+v %v", sw, err)
	}
	tomb := blobBytes(t, r.dir) - before
	recs := r.deleted(t)
	plan, err := NewPlan(Input{Deleted: recs}, Policy{Purge: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Apply(ctx, r.t, plan, ApplyOptions{})
	if err != nil || len(res) != 2 || !res[0].Done || !res[1].Done {
		t.Fatalf("apply: %+v %v", res, err)
	}
	if len(r.deleted(t)) != 0 {
		t.Error("tombstones left after purge")
	}
	sw, err := SweepLayout(ctx, r.dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	// What went is exactly what only v1, v4 and the tombstones had (the
	// purge deleted the manifests, the sweep the rest).
	unique += tomb
	if after := blobBytes(t, r.dir); before+tomb-after != unique || sw.Bytes <= 0 || sw.Bytes > unique {
		t.Errorf("disk use %d -> %d (swept %d), want a drop of %d", before+tomb, after, sw.Bytes, unique)
	}
	for _, v := range vs[1:] {
		r.intact(t, v)
	}
	if got := r.list(t); len(got) != 2 {
		t.Errorf("versions after purge: %v", got)
	}
	// A sweep with a grace period leaves young unreachable blobs alone.
	stray := filepath.Join(r.dir, "blobs", "sha256", digest.FromString("stray").Encoded())
	if err := os.WriteFile(stray, []byte("stray"), 0o644); err != nil {
		t.Fatal(err)
	}
	if sw, _ := SweepLayout(ctx, r.dir, time.Hour); sw.Blobs != 0 {
		t.Errorf("young blob swept: %+v", sw)
	}
	if sw, _ := SweepLayout(ctx, r.dir, 0); sw.Blobs != 1 {
		t.Errorf("stray blob not swept: %+v", sw)
	}
}

// uniqueBytes sums the blobs (manifests included) that gone reach and keep
// do not.
func uniqueBytes(t *testing.T, r repo, gone, keep []*push.Result) int64 {
	t.Helper()
	reach := func(vs []*push.Result) map[digest.Digest]int64 {
		m := map[digest.Digest]int64{}
		for _, v := range vs {
			m[v.Root.Digest] = v.Root.Size
			ver, err := layout.Open(context.Background(), r.t, v.Root)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range ver.ChunkDescriptors() {
				m[c.Digest] = c.Size
			}
			for _, d := range manifestsUnder(t, r, v.Root) {
				m[d.Digest] = d.Size
			}
		}
		return m
	}
	k := reach(keep)
	var n int64
	for d, size := range reach(gone) {
		if _, ok := k[d]; !ok {
			n += size
		}
	}
	return n
}

// manifestsUnder returns the config, index blob and part manifests under root.
func manifestsUnder(t *testing.T, r repo, root ocispec.Descriptor) []ocispec.Descriptor {
	t.Helper()
	ctx := context.Background()
	var out []ocispec.Descriptor
	b, err := fetchExact(ctx, r.t, root)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Config    *ocispec.Descriptor  `json:"config"`
		Layers    []ocispec.Descriptor `json:"layers"`
		Manifests []ocispec.Descriptor `json:"manifests"`
	}
	mustUnmarshal(t, b, &m)
	if m.Config != nil {
		out = append(out, *m.Config)
	}
	out = append(out, m.Layers...)
	for _, p := range m.Manifests {
		out = append(out, p)
		out = append(out, manifestsUnder(t, r, p)...)
	}
	return out
}

func TestApplyRechecks(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	vs := threeVersions(t, r)
	snapshot, err := versions.List(ctx, r.t)
	if err != nil {
		t.Fatal(err)
	}
	var in []versions.Version
	for _, v := range snapshot {
		in = append(in, v)
	}
	// Keep nothing but what is tagged "keep-*": all three are planned for deletion.
	plan, err := NewPlan(Input{Versions: in}, Policy{KeepTags: []string{"keep-*"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range plan.Versions {
		if d.Action != ActionDelete {
			t.Fatalf("plan: %+v", d)
		}
	}
	// Between plan and apply: v1 gets a kept tag, a deploy file starts
	// naming v2, and a new version is sealed.
	root, err := versions.Resolve(ctx, r.t, oci.Ref{Digest: vs[0].Root.Digest})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := versions.Tag(ctx, r.t, root, []string{"keep-me"}, versions.TagOptions{}); err != nil {
		t.Fatal(err)
	}
	v4 := r.push(t, map[string][]byte{"x": testutil.Pattern(4, 10<<10)}, t0.Add(time.Hour), 0)
	src := func(context.Context) ([]Reference, error) {
		return []Reference{{Source: "deploy/app.yaml:3", Digest: vs[1].Root.Digest}}, nil
	}
	var seen []Result
	res, err := Apply(ctx, r.t, plan, ApplyOptions{Sources: src, OnResult: func(r Result) { seen = append(seen, r) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 || len(seen) != 3 {
		t.Fatalf("results %+v", res)
	}
	byDigest := map[digest.Digest]Result{}
	for _, x := range res {
		byDigest[x.Digest] = x
	}
	if x := byDigest[vs[0].Root.Digest]; x.Done || x.Skipped == "" {
		t.Errorf("v1 tagged keep-me since the plan: %+v", x)
	}
	if x := byDigest[vs[1].Root.Digest]; x.Done || x.Skipped == "" {
		t.Errorf("v2 referenced since the plan: %+v", x)
	}
	if x := byDigest[vs[2].Root.Digest]; !x.Done || x.Tombstone == "" {
		t.Errorf("v3: %+v", x)
	}
	got := r.list(t)
	want := []digest.Digest{v4.Root.Digest, vs[1].Root.Digest, vs[0].Root.Digest}
	if !slices.Equal(got, want) {
		t.Errorf("versions %v, want %v", got, want)
	}
}

func TestConcurrentApply(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	vs := threeVersions(t, r)
	in := []versions.Version{{Digest: vs[0].Root.Digest, Sealed: t0}, {Digest: vs[1].Root.Digest, Sealed: t0.Add(time.Minute)}}
	plan, err := NewPlan(Input{Versions: in}, Policy{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { _, errs[i] = Apply(ctx, r.t, plan, ApplyOptions{}) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := r.list(t); !slices.Equal(got, []digest.Digest{vs[2].Root.Digest}) {
		t.Errorf("versions %v", got)
	}
	// However many tombstones the runs made, purging them all works, and
	// what is left is whole.
	plan, err = NewPlan(Input{Deleted: r.deleted(t)}, Policy{Purge: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range errs {
		wg.Go(func() { _, errs[i] = Apply(ctx, r.t, plan, ApplyOptions{}) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if d := r.deleted(t); len(d) != 0 {
		t.Errorf("left: %+v", d)
	}
	if _, err := SweepLayout(ctx, r.dir, 0); err != nil {
		t.Fatal(err)
	}
	r.intact(t, vs[2])
}

func TestPurgeSkipsRestored(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	vs := threeVersions(t, r)
	d := vs[0].Root.Digest
	if _, err := SoftDelete(ctx, r.t, d, DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	recs := r.deleted(t)
	// Re-pushing the same content seals it again.
	if _, err := oci.TagVersion(ctx, r.t, vs[0].Root, vs[0].RootBytes, nil, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if ds := r.deleted(t); len(ds) != 1 || !ds[0].Live {
		t.Fatalf("re-sealed version's tombstone: %+v", ds)
	}
	err := Purge(ctx, r.t, recs[0], PurgeOptions{})
	if !errors.Is(err, ErrKept) {
		t.Fatalf("purge of a re-sealed version: %v", err)
	}
	if len(r.deleted(t)) != 0 || !slices.Contains(r.list(t), d) {
		t.Error("purge should drop only the tombstone")
	}
	r.intact(t, vs[0])
	// A reference stops a purge.
	if _, err := SoftDelete(ctx, r.t, d, DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	src := func(context.Context) ([]Reference, error) { return []Reference{{Source: "f:1", Digest: d}}, nil }
	if err := Purge(ctx, r.t, r.deleted(t)[0], PurgeOptions{Sources: src}); !errors.Is(err, ErrKept) {
		t.Fatalf("purge of a referenced version: %v", err)
	}
	r.intact(t, vs[0])
}

func mustUnmarshal(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}
