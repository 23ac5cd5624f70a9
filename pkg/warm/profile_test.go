package warm

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/profile"
	"github.com/bdnvol/bdnvol/pkg/push"
)

func TestWarmFetchesTheProfileFirst(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	testutil.WriteTree(t, filepath.Join(dir, "tree"), map[string][]byte{"a.bin": testutil.RandBytes(5, 300<<10)})
	refStr, root := pushTree(t, filepath.Join(dir, "tree"), filepath.Join(dir, "layout"))
	cache, err := chunkcache.Open(filepath.Join(dir, "cache"), 0)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := Open(ctx, cache, refStr, "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	n := len(plain.Need)
	if n < 6 {
		t.Fatalf("%d chunks, want several", n)
	}
	first := []digest.Digest{plain.Need[n-1].Digest, plain.Need[n/2].Digest}
	file := filepath.Join(dir, "p.json")
	if err := os.WriteFile(file, profile.New(root.Digest, first).Encode(), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, opt := range map[string]profile.Options{
		"file": {Mode: file},
		"auto": {Mode: profile.ModeAuto, Store: storeWith(t, profile.New(root.Digest, first))},
	} {
		plan, err := Open(ctx, cache, refStr, "", Options{Profile: opt})
		if err != nil {
			t.Fatal(err)
		}
		if len(plan.Need) != n || plan.Need[0].Digest != first[0] || plan.Need[1].Digest != first[1] {
			t.Fatalf("%s: plan starts %v (%d chunks), want %v first of %d", name, plan.Need[:2], len(plan.Need), first, n)
		}
		// The rest keep their file order.
		for i, j := 2, 0; i < n; i++ {
			for plain.Need[j].Digest == first[0] || plain.Need[j].Digest == first[1] {
				j++
			}
			if plan.Need[i].Digest != plain.Need[j].Digest {
				t.Fatalf("%s: chunk %d is %s, want %s", name, i, plan.Need[i].Digest, plain.Need[j].Digest)
			}
			j++
		}
	}
	// A profile of another version changes nothing.
	other := filepath.Join(dir, "other.json")
	if err := os.WriteFile(other, profile.New(digest.FromString("x"), first).Encode(), 0o644); err != nil {
		t.Fatal(err)
	}
	plan, err := Open(ctx, cache, refStr, "", Options{Profile: profile.Options{Mode: other}})
	if err != nil || plan.Need[0].Digest != plain.Need[0].Digest {
		t.Fatalf("a profile of another version reordered the plan (%v)", err)
	}
}

func storeWith(t *testing.T, p *profile.Profile) profile.Store {
	s := profile.Store{Dir: t.TempDir()}
	if err := s.Save(p); err != nil {
		t.Fatal(err)
	}
	return s
}

// pushTree pushes the tree at src, in small chunks, to the OCI layout at dir
// as tag v1, and returns the reference and the version's root.
func pushTree(t *testing.T, src, dir string) (string, ocispec.Descriptor) {
	t.Helper()
	ctx := context.Background()
	refStr := "oci:" + dir + ":v1"
	ref, _ := oci.ParseRef(refStr)
	tgt, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := push.Push(ctx, tgt, push.DirSource(src), push.Options{Params: layout.Params{Min: 4 << 10, Avg: 16 << 10, Max: 64 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tgt.Tag(ctx, res.Root, "v1"); err != nil {
		t.Fatal(err)
	}
	return refStr, res.Root
}
