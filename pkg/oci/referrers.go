package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strings"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"

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
		if !IsManifest(d.MediaType) || d.Size <= 0 || d.Size > MaxManifestBytes {
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

// ReferrersProber is a target that can tell whether it serves the OCI 1.1
// referrers API.
type ReferrersProber interface {
	// ServesReferrers asks for the referrers of subject and reports
	// whether the answer came from the referrers API.
	ServesReferrers(ctx context.Context, subject ocispec.Descriptor) (bool, error)
}

var _ ReferrersProber = (*repository)(nil)

// ServesReferrers reports whether t serves the OCI 1.1 referrers API: true
// for a registry that answers GET /v2/<name>/referrers/<subject> with an
// image index, false for one that answers 404 (it has no such route) and
// for targets that cannot be asked (an OCI layout, whose referrers
// Referrers finds by scanning).
func ServesReferrers(ctx context.Context, t any, subject ocispec.Descriptor) (bool, error) {
	p, ok := t.(ReferrersProber)
	if !ok {
		return false, nil
	}
	return p.ServesReferrers(ctx, subject)
}

// ServesReferrers GETs the referrers of subject. The repository remembers
// the answer, so that a manifest with a subject pushed afterwards is not
// also indexed under the referrers tag schema where the registry lists it
// by itself (oras-go decides that from the push's OCI-Subject header,
// which some registries serving the API do not send).
func (r *repository) ServesReferrers(ctx context.Context, subject ocispec.Descriptor) (bool, error) {
	u := fmt.Sprintf("%s/v2/%s/referrers/%s", r.base, r.Reference.Repository, subject.Digest)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Accept", ocispec.MediaTypeImageIndex)
	resp, err := r.client.Do(req)
	if err != nil {
		return false, fmt.Errorf("referrers of %s in %s: %w", subject.Digest, r.Reference, err)
	}
	defer drain(resp)
	var ok bool
	switch resp.StatusCode {
	case http.StatusOK:
		ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
		ok = ct == ocispec.MediaTypeImageIndex
	case http.StatusNotFound:
	default:
		return false, fmt.Errorf("referrers of %s in %s: %w", subject.Digest, r.Reference, answerError("referrers GET", resp))
	}
	if err := r.Repository.SetReferrersCapability(ok); err != nil && !errors.Is(err, remote.ErrReferrersCapabilityAlreadySet) {
		return ok, err
	}
	return ok, nil
}
