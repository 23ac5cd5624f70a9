package retention

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// TestSweepLayoutHostileIndex: a manifest in index.json that claims a
// terabyte is never allocated for, and since what it reaches is unknown,
// nothing is swept.
func TestSweepLayoutHostileIndex(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	r.push(t, map[string][]byte{"a": testutil.Pattern(1, 100<<10)}, time.Now(), 0, "v1")
	orphan := []byte("an orphan blob")
	od := digest.FromBytes(orphan)
	op := filepath.Join(r.dir, "blobs", "sha256", od.Encoded())
	if err := os.WriteFile(op, orphan, 0o644); err != nil {
		t.Fatal(err)
	}
	ip := filepath.Join(r.dir, ocispec.ImageIndexFile)
	good, err := os.ReadFile(ip)
	if err != nil {
		t.Fatal(err)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(good, &idx); err != nil {
		t.Fatal(err)
	}
	huge := digest.FromString("huge")
	idx.Manifests = append(idx.Manifests, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: huge, Size: 1 << 40})
	b, _ := json.Marshal(idx)
	if err := os.WriteFile(ip, b, 0o644); err != nil {
		t.Fatal(err)
	}
	hp := filepath.Join(r.dir, "blobs", "sha256", huge.Encoded())
	if err := os.WriteFile(hp, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(hp, 1<<40); err != nil {
		t.Fatal(err)
	}
	if _, err := SweepLayout(ctx, r.dir, 0); !errors.Is(err, oci.ErrInvalidLayout) {
		t.Fatalf("sweep: %v, want oci.ErrInvalidLayout", err)
	}
	if _, err := os.Stat(op); err != nil {
		t.Fatalf("a refused sweep removed a blob: %v", err)
	}
	if err := os.WriteFile(ip, good, 0o644); err != nil {
		t.Fatal(err)
	}
	sw, err := SweepLayout(ctx, r.dir, 0)
	if err != nil || sw.Blobs != 2 {
		t.Fatalf("sweep of the honest layout: %+v %v, want the orphan and the huge blob", sw, err)
	}
}

// TestSweepLayoutRefusesSymlinkedBlobs: blobs/ planted as a symlink to a
// directory outside the layout makes the sweep fail with
// oci.ErrInvalidLayout naming it, and nothing outside is removed; a symlink
// at a blob's name is left alone, and so is its target.
func TestSweepLayoutRefusesSymlinkedBlobs(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	r.push(t, map[string][]byte{"a": testutil.Pattern(1, 100<<10)}, time.Now(), 0, "v1")
	blobs := filepath.Join(r.dir, "blobs")
	outside := t.TempDir()
	// An unreachable blob outside, where a followed blobs/ would lead.
	victim := filepath.Join(outside, "sha256", digest.FromString("victim").Encoded())
	if err := os.MkdirAll(filepath.Dir(victim), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(victim, []byte("victim"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A symlink at an unreachable blob name, to a file outside.
	target := filepath.Join(outside, "target")
	if err := os.WriteFile(target, []byte("target"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(blobs, "sha256", digest.FromString("link").Encoded())); err != nil {
		t.Fatal(err)
	}
	sw, err := SweepLayout(ctx, r.dir, 0)
	if err != nil || sw.Blobs != 0 {
		t.Errorf("sweep with a symlinked blob: %+v %v, want nothing swept", sw, err)
	}
	if _, err := os.Stat(target); err != nil {
		t.Errorf("a symlinked blob's target is gone: %v", err)
	}
	if err := os.Rename(blobs, filepath.Join(r.dir, "blobs.real")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, blobs); err != nil {
		t.Fatal(err)
	}
	if _, err := SweepLayout(ctx, r.dir, 0); !errors.Is(err, oci.ErrInvalidLayout) || !strings.Contains(err.Error(), blobs) {
		t.Errorf("sweep through a symlinked blobs/: %v, want oci.ErrInvalidLayout naming it", err)
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("a blob outside the layout was removed: %v", err)
	}
}
