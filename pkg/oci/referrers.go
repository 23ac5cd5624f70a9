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

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// Referrers returns the manifests in t whose subject is subject, filtered
// by artifactType ("" for all; an image's artifact type is its config's
// media type), sorted by digest. Each descriptor carries the referrer's
// artifactType and annotations. A registry is asked through the referrers
// API, and through the tag schema (the index tagged sha256-<hex>) when it
// lacks the API; an OCI layout is scanned (the manifests listed in
// index.json). The listing is bounded as EachReferrer's is.
func Referrers(ctx context.Context, t content.ReadOnlyGraphStorage, subject ocispec.Descriptor, artifactType string) ([]ocispec.Descriptor, error) {
	var out []ocispec.Descriptor
	err := EachReferrer(ctx, t, subject, artifactType, func(d ocispec.Descriptor) error {
		out = append(out, d)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return sortDescs(out), nil
}

// EachReferrer calls fn with each manifest in t whose subject is subject,
// filtered by artifactType as Referrers is, in the order the registry
// lists them (a layout's: index.json's), each once. It follows pagination
// within the bounds MaxReferrers, MaxReferrerBytes and MaxReferrerPages.
// fn returning StopListing ends the listing (nil is returned, no further
// page is asked for); another error ends it with that error. A subject
// without referrers, or a registry without them, lists none.
func EachReferrer(ctx context.Context, t content.ReadOnlyGraphStorage, subject ocispec.Descriptor, artifactType string, fn func(ocispec.Descriptor) error) error {
	what := fmt.Sprintf("referrers of %s", subject.Digest)
	n, bytes := 0, 0
	seen := map[digest.Digest]bool{}
	give := func(d ocispec.Descriptor) error {
		if seen[d.Digest] {
			return nil
		}
		n++
		bytes += descBytes(d)
		if n > MaxReferrers {
			return fmt.Errorf("%s: %w: more than %d", what, ErrListTooLong, MaxReferrers)
		}
		if bytes > MaxReferrerBytes {
			return fmt.Errorf("%s: %w: descriptors of more than %d bytes together", what, ErrListTooLong, MaxReferrerBytes)
		}
		seen[d.Digest] = true
		return fn(d)
	}
	if rl, ok := t.(registry.ReferrerLister); ok {
		g := newListGuard(what, MaxReferrerPages)
		err := rl.Referrers(g.with(ctx), subject, artifactType, func(ds []ocispec.Descriptor) error {
			if len(ds) > 0 {
				ks := make([]string, len(ds))
				for i, d := range ds {
					ks[i] = string(d.Digest)
				}
				if err := g.page(pageHash(ks)); err != nil {
					return err
				}
			}
			for _, d := range ds {
				if err := give(d); err != nil {
					return err
				}
			}
			return ctx.Err()
		})
		switch {
		case err == nil, errors.Is(err, StopListing), errors.Is(err, errdef.ErrNotFound):
			return nil
		case errors.Is(err, ErrListTooLong), errors.Is(err, ErrRepeatedPage):
			return err
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	pf := t
	preds, err := pf.Predecessors(ctx, subject)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	for _, d := range preds {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !IsManifest(d.MediaType) || d.Size <= 0 || d.Size > MaxManifestBytes {
			continue
		}
		b, err := verify.Fetch(ctx, pf, "", d)
		if errors.Is(err, errdef.ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %s: %w", what, d.Digest, err)
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
		err = give(ocispec.Descriptor{
			MediaType: d.MediaType, Digest: d.Digest, Size: d.Size,
			ArtifactType: at, Annotations: m.Annotations,
		})
		if errors.Is(err, StopListing) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// descBytes is about the memory a listed descriptor holds: its strings.
func descBytes(d ocispec.Descriptor) int {
	n := len(d.MediaType) + len(d.Digest) + len(d.ArtifactType) + 64
	for k, v := range d.Annotations {
		n += len(k) + len(v)
	}
	for _, u := range d.URLs {
		n += len(u)
	}
	if p := d.Platform; p != nil {
		n += len(p.Architecture) + len(p.OS) + len(p.OSVersion) + len(p.Variant)
		for _, f := range p.OSFeatures {
			n += len(f)
		}
	}
	return n + len(d.Data)
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
	r.refsKnown.Store(true)
	return ok, nil
}
