package retention

import (
	"context"
	"fmt"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/signature"
	"github.com/bdnvol/bdnvol/pkg/warmstate"
)

// deleteSignatures deletes the signatures of the version root is the
// manifest of (its tag-scheme manifest and its signature referrers). Only
// Purge calls it: a soft-deleted version keeps its signatures, so that a
// restored version is still signed.
func deleteSignatures(ctx context.Context, t oci.Target, root ocispec.Descriptor) error {
	if _, err := signature.Delete(ctx, t, root); err != nil {
		return fmt.Errorf("%s: signatures: %w", root.Digest, err)
	}
	return nil
}

// deleteCompanions deletes the warm-state companions of the version root
// (each index and its signatures; their trees' blobs stay for the
// registry's garbage collector, or SweepLayout).
func deleteCompanions(ctx context.Context, t oci.Target, root ocispec.Descriptor) error {
	cs, err := warmstate.List(ctx, t, root)
	if err != nil {
		return fmt.Errorf("%s: warm-state companions: %w", root.Digest, err)
	}
	for _, c := range cs {
		if err := warmstate.Delete(ctx, t, c.Desc); err != nil {
			return fmt.Errorf("%s: %w", root.Digest, err)
		}
	}
	return nil
}
