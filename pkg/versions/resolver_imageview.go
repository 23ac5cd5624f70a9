package versions

import (
	"context"
	"fmt"

	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2"

	"github.com/bdnvol/bdnvol/pkg/deploy"
	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

var _ deploy.ImageViewResolver = (*Resolver)(nil)

// ImageView implements deploy.ImageViewResolver: it reads the image's
// manifest (at most layout.MaxManifestBytes) and the version it names.
func (r *Resolver) ImageView(ctx context.Context, ref oci.Ref) (digest.Digest, digest.Digest, error) {
	t, err := r.target(ctx, ref)
	if err != nil {
		return "", "", err
	}
	opts := oras.DefaultFetchBytesOptions
	opts.MaxBytes = layout.MaxManifestBytes
	desc, b, err := oras.FetchBytes(ctx, t, ref.Reference(), opts)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", ref, err)
	}
	if ref.Digest != "" && desc.Digest != ref.Digest {
		return "", "", fmt.Errorf("%s: resolved to %s", ref, desc.Digest)
	}
	v := imageview.VolumeOf(b)
	if v == "" {
		return "", "", fmt.Errorf("%s: %w", ref, deploy.ErrNotImageView)
	}
	return desc.Digest, v, nil
}
