package imageview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// List returns the image views attached to the version d in t: its
// referrers that are images whose manifest names d in
// AnnotationVolumeDigest.
func List(ctx context.Context, t oci.Target, d digest.Digest) ([]ocispec.Descriptor, error) {
	return ListOf(ctx, t, d, ocispec.MediaTypeImageConfig)
}

// ListOf returns the views of artifact type artifactType attached to the
// version d in t: its referrers of that type whose manifest names d in
// AnnotationVolumeDigest.
func ListOf(ctx context.Context, t oci.Target, d digest.Digest, artifactType string) ([]ocispec.Descriptor, error) {
	refs, err := oci.Referrers(ctx, t, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: d}, artifactType)
	if err != nil {
		return nil, err
	}
	var out []ocispec.Descriptor
	for _, r := range refs {
		v, ok := r.Annotations[AnnotationVolumeDigest]
		if !ok {
			// The listing may omit annotations: read the manifest.
			ann, err := manifestAnnotations(ctx, t, r)
			if errors.Is(err, errdef.ErrNotFound) {
				continue
			}
			if err != nil {
				return nil, err
			}
			v = ann[AnnotationVolumeDigest]
		}
		if v == d.String() {
			out = append(out, r)
		}
	}
	return out, nil
}

// VolumeOf returns the version an image manifest m (its bytes) is a view
// of, or "" when it is not an image view.
func VolumeOf(m []byte) digest.Digest {
	var x struct {
		MediaType   string              `json:"mediaType"`
		Config      *ocispec.Descriptor `json:"config"`
		Subject     *ocispec.Descriptor `json:"subject"`
		Annotations map[string]string   `json:"annotations"`
	}
	if json.Unmarshal(m, &x) != nil || x.Config == nil || x.Config.MediaType != ocispec.MediaTypeImageConfig {
		return ""
	}
	d, err := digest.Parse(x.Annotations[AnnotationVolumeDigest])
	if err != nil || x.Subject != nil && x.Subject.Digest != d {
		return ""
	}
	return d
}

func manifestAnnotations(ctx context.Context, t oci.Target, desc ocispec.Descriptor) (map[string]string, error) {
	if desc.Size <= 0 || desc.Size > oci.MaxManifestBytes {
		return nil, fmt.Errorf("manifest %s: %d bytes", desc.Digest, desc.Size)
	}
	b, err := verify.Fetch(ctx, t, "", desc)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	var m struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	return m.Annotations, nil
}
