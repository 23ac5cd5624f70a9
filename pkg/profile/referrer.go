package profile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// maxReferrers bounds the profile referrers of a version Fetch looks at.
const maxReferrers = 16

// Push attaches p to its version, whose root is subject, in t: an OCI 1.1
// referrer with artifact type MediaType and the document as its one layer.
// The same profile always gives the same manifest. It returns the
// manifest's descriptor.
func Push(ctx context.Context, t oci.Target, subject ocispec.Descriptor, p *Profile) (ocispec.Descriptor, error) {
	if p.Version != subject.Digest {
		return ocispec.Descriptor{}, fmt.Errorf("%w: %s, not %s", ErrOtherVersion, p.Version, subject.Digest)
	}
	doc := p.Encode()
	layer := content.NewDescriptorFromBytes(MediaType, doc)
	cfg := ocispec.DescriptorEmptyJSON
	m := ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: MediaType,
		Config:       ocispec.Descriptor{MediaType: cfg.MediaType, Digest: cfg.Digest, Size: cfg.Size},
		Layers:       []ocispec.Descriptor{layer},
		Subject:      &ocispec.Descriptor{MediaType: subject.MediaType, Digest: subject.Digest, Size: subject.Size},
	}
	mb, err := json.Marshal(m)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	md := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, mb)
	md.ArtifactType = MediaType
	// Asking first keeps the push from also writing the tag-schema index
	// where the registry lists referrers itself.
	if _, err := oci.ServesReferrers(ctx, t, *m.Subject); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("profile of %s: %w", subject.Digest, err)
	}
	for _, b := range []struct {
		d ocispec.Descriptor
		p []byte
	}{{layer, doc}, {cfg, cfg.Data}, {md, mb}} {
		if err := pushIfMissing(ctx, t, b.d, b.p); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("profile of %s: %w", subject.Digest, err)
		}
	}
	return md, nil
}

func pushIfMissing(ctx context.Context, t oci.Target, d ocispec.Descriptor, b []byte) error {
	if ok, err := t.Exists(ctx, d); err == nil && ok {
		return nil
	}
	if err := t.Push(ctx, d, bytes.NewReader(b)); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
		return fmt.Errorf("push %s %s: %w", d.MediaType, d.Digest, err)
	}
	return nil
}

// Fetch returns the profile attached to the version whose root is subject
// in t; ErrNotFound when none is. It looks at the first maxReferrers
// profile referrers the registry lists (asking for no further page); of
// those, the first by manifest digest that parses and names subject wins.
// Every byte is checked against its digest and the document against
// Parse's bounds.
func Fetch(ctx context.Context, t oci.Target, subject ocispec.Descriptor) (*Profile, error) {
	var refs []ocispec.Descriptor
	// A mount waits for this: ask the referrers API and the tag schema
	// at once.
	err := oci.EachReferrer(oci.WithEagerReferrers(ctx), t, subject, MediaType, func(d ocispec.Descriptor) error {
		refs = append(refs, d)
		if len(refs) == maxReferrers {
			return oci.StopListing
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(refs, func(a, b ocispec.Descriptor) int { return strings.Compare(string(a.Digest), string(b.Digest)) })
	var errs []error
	for _, r := range refs {
		p, err := fetchOne(ctx, t, r)
		if err == nil && p.Version != subject.Digest {
			err = fmt.Errorf("%w: %s", ErrOtherVersion, p.Version)
		}
		if err == nil {
			return p, nil
		}
		errs = append(errs, fmt.Errorf("profile %s: %w", r.Digest, err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return nil, fmt.Errorf("%s: %w", subject.Digest, ErrNotFound)
}

func fetchOne(ctx context.Context, t oci.Target, r ocispec.Descriptor) (*Profile, error) {
	if r.Size <= 0 || r.Size > oci.MaxManifestBytes {
		return nil, fmt.Errorf("%w: manifest of %d bytes", ErrInvalid, r.Size)
	}
	mb, err := verify.Fetch(ctx, t, "", r)
	if err != nil {
		return nil, err
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		return nil, fmt.Errorf("%w: manifest: %v", ErrInvalid, err)
	}
	if len(m.Layers) != 1 || m.Layers[0].MediaType != MediaType {
		return nil, fmt.Errorf("%w: manifest has %d layers, want one %s", ErrInvalid, len(m.Layers), MediaType)
	}
	l := m.Layers[0]
	if l.Size <= 0 || l.Size > MaxBytes {
		return nil, fmt.Errorf("%w: document of %d bytes, more than %d", ErrInvalid, l.Size, MaxBytes)
	}
	b, err := verify.Fetch(ctx, t, "", l)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}
