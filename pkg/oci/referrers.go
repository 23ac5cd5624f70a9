package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// Referrers returns the manifests in t whose subject is subject, filtered
// by artifactType ("" for all; an image's artifact type is its config's
// media type). Each descriptor carries the referrer's artifactType and
// annotations. A registry is asked through the referrers API, and through
// the tag schema (the index tagged sha256-<hex>) when it lacks the API; an
// OCI layout is scanned (the manifests listed in index.json).
func Referrers(ctx context.Context, t Target, subject ocispec.Descriptor, artifactType string) ([]ocispec.Descriptor, error) {
	var out []ocispec.Descriptor
	if rl, ok := t.(registry.ReferrerLister); ok {
		err := rl.Referrers(ctx, subject, artifactType, func(ds []ocispec.Descriptor) error {
			out = append(out, ds...)
			return nil
		})
		if errors.Is(err, errdef.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("referrers of %s: %w", subject.Digest, err)
		}
		return sortDescs(out), nil
	}
	pf, ok := t.(content.ReadOnlyGraphStorage)
	if !ok {
		return nil, fmt.Errorf("referrers of %s: %w", subject.Digest, errdef.ErrUnsupported)
	}
	preds, err := pf.Predecessors(ctx, subject)
	if err != nil {
		return nil, fmt.Errorf("referrers of %s: %w", subject.Digest, err)
	}
	for _, d := range preds {
		if !isManifest(d.MediaType) || d.Size <= 0 || d.Size > MaxManifestBytes {
			continue
		}
		b, err := verify.Fetch(ctx, pf, "", d)
		if errors.Is(err, errdef.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("referrers of %s: %s: %w", subject.Digest, d.Digest, err)
		}
		var m struct {
			ArtifactType string              `json:"artifactType"`
			Config       *ocispec.Descriptor `json:"config"`
			Subject      *ocispec.Descriptor `json:"subject"`
			Annotations  map[string]string   `json:"annotations"`
		}
		if json.Unmarshal(b, &m) != nil || m.Subject == nil || m.Subject.Digest != subject.Digest {
			continue
		}
		at := m.ArtifactType
		if at == "" && m.Config != nil {
			at = m.Config.MediaType
		}
		if artifactType != "" && at != artifactType {
			continue
		}
		out = append(out, ocispec.Descriptor{
			MediaType: d.MediaType, Digest: d.Digest, Size: d.Size,
			ArtifactType: at, Annotations: m.Annotations,
		})
	}
	return sortDescs(out), nil
}

func sortDescs(ds []ocispec.Descriptor) []ocispec.Descriptor {
	slices.SortFunc(ds, func(a, b ocispec.Descriptor) int { return strings.Compare(string(a.Digest), string(b.Digest)) })
	return slices.CompactFunc(ds, func(a, b ocispec.Descriptor) bool { return a.Digest == b.Digest })
}
