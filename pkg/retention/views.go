package retention

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/modelpack"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// DeleteImageViews deletes the image views and ModelPack views attached to
// the version d (see packages imageview and modelpack) by digest, and returns those it deleted. One already
// gone counts as deleted. Their layers stay for the registry's garbage
// collector (in an OCI layout, for SweepLayout).
func DeleteImageViews(ctx context.Context, t oci.Target, d digest.Digest) ([]ocispec.Descriptor, error) {
	views, err := imageview.List(ctx, t, d)
	if err != nil {
		return nil, fmt.Errorf("image views of %s: %w", d, err)
	}
	mp, err := modelpack.Views(ctx, t, d)
	if err != nil {
		return nil, fmt.Errorf("ModelPack views of %s: %w", d, err)
	}
	views = append(views, mp...)
	var done []ocispec.Descriptor
	var errs []error
	for _, v := range views {
		if err := t.Delete(ctx, v); err != nil && !errors.Is(err, errdef.ErrNotFound) {
			errs = append(errs, fmt.Errorf("image view %s of %s: %w", v.Digest, d, err))
			continue
		}
		done = append(done, v)
	}
	if len(errs) == 0 && len(done) > 0 {
		if err := dropFallbackIndex(ctx, t, d, done); err != nil {
			errs = append(errs, err)
		}
	}
	return done, errors.Join(errs...)
}

// dropFallbackIndex deletes the referrers tag-schema index of d (tag
// sha256-<hex>) when it lists nothing but the deleted manifests: a registry
// that serves the referrers API but leaves its clients to keep the index
// (go-containerregistry's) would keep it, naming manifests that are gone.
func dropFallbackIndex(ctx context.Context, t oci.Target, d digest.Digest, deleted []ocispec.Descriptor) error {
	tag := d.Algorithm().String() + "-" + d.Encoded()
	desc, err := t.Resolve(ctx, tag)
	if errors.Is(err, errdef.ErrNotFound) {
		return nil
	}
	if err != nil || desc.MediaType != ocispec.MediaTypeImageIndex || desc.Size <= 0 || desc.Size > oci.MaxManifestBytes {
		return nil // not a referrers index: not ours to touch
	}
	b, err := verify.Fetch(ctx, t, "", desc)
	if err != nil {
		return nil
	}
	var x ocispec.Index
	if json.Unmarshal(b, &x) != nil {
		return nil
	}
	gone := map[digest.Digest]bool{}
	for _, v := range deleted {
		gone[v.Digest] = true
	}
	for _, m := range x.Manifests {
		if !gone[m.Digest] {
			return nil
		}
	}
	if err := t.Delete(ctx, desc); err != nil && !errors.Is(err, errdef.ErrNotFound) {
		return fmt.Errorf("referrers index %s of %s: %w", tag, d, err)
	}
	return nil
}
