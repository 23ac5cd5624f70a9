package modelpack

import (
	"context"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// Views returns the ModelPack views export attached to the version d in t:
// its referrers of the ModelPack artifact type whose manifest names d in
// AnnotationVolumeDigest. gc deletes them with the version, as it does
// image views.
func Views(ctx context.Context, t oci.Target, d digest.Digest) ([]ocispec.Descriptor, error) {
	return imageview.ListOf(ctx, t, d, ArtifactType)
}
