package retention

import (
	"context"
	"errors"
	"fmt"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// DeleteImageViews deletes the image views attached to the version d (see
// package imageview) by digest, and returns those it deleted. One already
// gone counts as deleted. Their layers stay for the registry's garbage
// collector (in an OCI layout, for SweepLayout).
func DeleteImageViews(ctx context.Context, t oci.Target, d digest.Digest) ([]ocispec.Descriptor, error) {
	views, err := imageview.List(ctx, t, d)
	if err != nil {
		return nil, fmt.Errorf("image views of %s: %w", d, err)
	}
	var done []ocispec.Descriptor
	var errs []error
	for _, v := range views {
		if err := t.Delete(ctx, v); err != nil && !errors.Is(err, errdef.ErrNotFound) {
			errs = append(errs, fmt.Errorf("image view %s of %s: %w", v.Digest, d, err))
			continue
		}
		done = append(done, v)
	}
	return done, errors.Join(errs...)
}
