package deploy

import (
	"context"
	"errors"
	"fmt"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// ErrNotImageView is wrapped when a reference is not an image view of a
// volume.
var ErrNotImageView = errors.New("not an image view of a bdnvol volume")

// ImageViewResolver is a Resolver that also recognises image views of
// volumes (images whose manifest names a version in the annotation
// io.bdnvol.volume.digest, made by bdnvol export-image).
type ImageViewResolver interface {
	Resolver
	// ImageView returns the digest of the image ref names (its digest if it
	// has one, else its tag's target) and of the version it is a view of.
	// Errors wrap ErrNotImageView when it is not one.
	ImageView(ctx context.Context, ref oci.Ref) (image, volume digest.Digest, err error)
}

// resolveAny resolves ref as a volume, or, when it is not one and res
// knows image views, as an image view (volume is then its version).
func resolveAny(ctx context.Context, res Resolver, ref oci.Ref) (d, volume digest.Digest, err error) {
	d, err = res.Resolve(ctx, ref)
	if err == nil || !errors.Is(err, layout.ErrNotVolume) {
		return d, "", err
	}
	iv, ok := res.(ImageViewResolver)
	if !ok {
		return "", "", err
	}
	img, vol, verr := iv.ImageView(ctx, ref)
	if verr != nil {
		return "", "", err // report it as what it is not: a volume
	}
	return img, vol, nil
}

// viewFinding checks an image view against the volume references of the
// same file: the version it shows must be the one the file pins for that
// volume's repository. It returns the reason of a mismatch, or "".
func viewFinding(ctx context.Context, res Resolver, volume digest.Digest, pinned []oci.Ref) string {
	var other []oci.Ref
	for _, p := range pinned {
		if p.Digest == volume {
			return ""
		}
		other = append(other, p)
	}
	for _, p := range other {
		q := p
		q.Tag, q.Digest = "", volume
		if d, err := res.Resolve(ctx, q); err == nil && d == volume {
			return fmt.Sprintf("image view of %s, but this file pins %s", q.Pinned(volume), p.Pinned(p.Digest))
		}
	}
	return ""
}
