package retention

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// RemoveOptions configure Remove.
type RemoveOptions struct {
	// Sources are the references that keep the version, read right before
	// it is deleted; nil for none.
	Sources Sources
	// Force deletes it even when a reference names it.
	Force bool
}

// Removed is what Remove did.
type Removed struct {
	Digest    digest.Digest
	Pinned    string   // REPO@DIGEST
	Tombstone string   // the tombstone tag that makes it restorable
	Tags      []string // the human tags it lost
	// Views are its image views, deleted with it; ViewsErr says why some
	// could not be (the version is deleted all the same).
	Views    []ocispec.Descriptor
	ViewsErr error
}

// Remove soft-deletes the version ref names, restorably, unless a
// reference of opt.Sources (or a tag kept by no rule: none) still needs
// it; then it deletes the version's image views. An OCI layout stays
// locked meanwhile.
func Remove(ctx context.Context, ref oci.Ref, ociOpt oci.Options, opt RemoveOptions) (*Removed, error) {
	t, unlock, err := oci.OpenLocked(ctx, ref, ociOpt, true)
	if err != nil {
		return nil, err
	}
	defer unlock()
	root, err := versions.Resolve(ctx, t, ref)
	if err != nil {
		return nil, err
	}
	d := root.Desc.Digest
	rec, err := SoftDelete(ctx, t, d, DeleteOptions{
		Check: func(ctx context.Context, tags []string) error {
			if opt.Force || opt.Sources == nil {
				return nil
			}
			refs, err := opt.Sources(ctx)
			if err != nil {
				return err
			}
			var why []string
			for _, r := range KeepReasons(versions.Version{Digest: d, Tags: tags}, refs, Policy{}) {
				why = append(why, r.Text)
			}
			if len(why) > 0 {
				return fmt.Errorf("%s is %w: %s; new replicas would fail to start without it",
					ref.Pinned(d), ErrStillNeeded, strings.Join(why, "; "))
			}
			return nil
		},
	})
	if errors.Is(err, ErrNotLive) {
		return nil, fmt.Errorf("%s: %w", ref.Pinned(d), err)
	}
	if err != nil {
		return nil, err
	}
	out := &Removed{Digest: d, Pinned: ref.Pinned(d), Tombstone: rec.Tag, Tags: rec.Tags}
	out.Views, out.ViewsErr = DeleteImageViews(ctx, t, d)
	return out, nil
}

// ErrNoRepository is wrapped when a version to restore is named by its
// digest alone.
var ErrNoRepository = errors.New("name the repository too: HOST/REPO@DIGEST or oci:PATH@DIGEST")

// ErrNoDigest is wrapped when a version to restore is named by a tag.
var ErrNoDigest = errors.New("restore takes a digest")

// ErrStillNeeded is wrapped when a version to remove is still referenced
// (a deploy file, a running mount, a protective tag) and removal is not
// forced.
var ErrStillNeeded = errors.New("still needed")

// ParseRestoreRef parses the deleted version to restore: REPO@DIGEST, or
// the repository s and the digest d apart (d "" when s holds both).
func ParseRestoreRef(s, d string) (oci.Ref, error) {
	if d != "" {
		s += "@" + d
	}
	if _, err := digest.Parse(s); err == nil {
		return oci.Ref{}, fmt.Errorf("%s: %w", s, ErrNoRepository)
	}
	ref, err := versions.ParseRef(s)
	if err != nil {
		return ref, err
	}
	if ref.Digest == "" {
		return ref, fmt.Errorf("%s: %w", s, ErrNoDigest)
	}
	return ref, nil
}

// RestoreRef brings back the deleted version ref names by digest (see
// Restore), an OCI layout locked meanwhile. It returns the new protective
// tag and a warning about what could not be brought back with it.
func RestoreRef(ctx context.Context, ref oci.Ref, ociOpt oci.Options) (tag string, warn error, err error) {
	t, unlock, err := oci.OpenLocked(ctx, ref, ociOpt, true)
	if err != nil {
		return "", nil, err
	}
	defer unlock()
	tag, warn, err = Restore(ctx, t, ref.Digest, time.Now())
	if errors.Is(err, ErrNoTombstone) {
		return "", nil, fmt.Errorf("%s: %w", ref.Pinned(ref.Digest), ErrNoTombstone)
	}
	return tag, warn, err
}
