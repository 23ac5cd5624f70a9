package modelpack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"

	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// A published index. The first open of a model on a machine reads every
// layer whole, to derive the chunk digests of the ranges it will serve:
// the model's digest vouches for whole layers only. A derived index,
// published once as a referrer of the model's manifest and signed with a
// key the reader's policy trusts, vouches for those chunk digests instead,
// so a fresh machine reads the manifest, the index and then only what its
// readers ask for, each chunk verified against the signed digests. An
// index that no trusted key signed, or that was altered after signing
// (its manifest's digest changes, so the signature no longer names it), is
// ignored, and the layers are read as before.

// IndexArtifactType is the artifactType of a published derived index: a
// manifest whose subject is the model's manifest and whose one layer is
// the index record (IndexMediaType).
const IndexArtifactType = "application/vnd.bdnvol.modelpack.index.v1+json"

// IndexMediaType is the media type of a published index's record.
const IndexMediaType = "application/vnd.bdnvol.modelpack.index.record.v1"

// maxIndexCandidates bounds the published indexes one open checks.
const maxIndexCandidates = 8

// Trust says where an open may take a published index from: the target
// the model is read from, the policy whose keys must have signed the
// index, and where to say what happened.
type Trust struct {
	Target oci.Target
	Policy signature.Policy
	Logf   func(format string, args ...any) // nil: say nothing
}

type trustKey struct{}

// WithTrust returns ctx carrying tr: an Open under it uses a published
// index that tr's policy trusts before reading the model's layers.
func WithTrust(ctx context.Context, tr Trust) context.Context {
	return context.WithValue(ctx, trustKey{}, &tr)
}

func trustOf(ctx context.Context) *Trust {
	tr, _ := ctx.Value(trustKey{}).(*Trust)
	return tr
}

// Counts are what opens of models did in this process.
type Counts struct {
	Published int64 // indexes taken from a signed, published index
	Derived   int64 // indexes derived by reading the layers whole
}

var published, derived atomic.Int64

// OpenCounts returns the counts of this process's opens.
func OpenCounts() Counts { return Counts{Published: published.Load(), Derived: derived.Load()} }

func (tr *Trust) logf(format string, args ...any) {
	if tr != nil && tr.Logf != nil {
		tr.Logf(format, args...)
	}
}

// published returns the map of model a from an index published beside it
// and signed by a key tr's policy holds, or nil with the reason there is
// none.
func (tr *Trust) published(ctx context.Context, a *Artifact) (*Map, error) {
	if !tr.Policy.Required() {
		return nil, errors.New("no signing key is trusted (no signature policy)")
	}
	cands, err := oci.Referrers(ctx, tr.Target, a.Desc, IndexArtifactType)
	if err != nil {
		return nil, err
	}
	if len(cands) == 0 {
		return nil, errors.New("none is published")
	}
	var why []string
	for i, d := range cands {
		if i == maxIndexCandidates {
			why = append(why, fmt.Sprintf("%d more not checked", len(cands)-i))
			break
		}
		m, err := tr.read(ctx, a, d)
		if err == nil {
			return m, nil
		}
		why = append(why, fmt.Sprintf("%s: %v", d.Digest, err))
	}
	return nil, errors.New(strings.Join(why, "; "))
}

// read returns the map of the published index d of model a, if a key of
// tr's policy signed d.
func (tr *Trust) read(ctx context.Context, a *Artifact, d ocispec.Descriptor) (*Map, error) {
	if d.Size <= 0 || d.Size > MaxIndexManifestBytes {
		return nil, fmt.Errorf("manifest of %d bytes", d.Size)
	}
	if err := tr.Policy.Check(ctx, tr.Target, d); err != nil {
		return nil, err
	}
	b, err := verify.Fetch(ctx, tr.Target, "manifest", d)
	if err != nil {
		return nil, err
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if m.ArtifactType != IndexArtifactType || m.Subject == nil || m.Subject.Digest != a.Desc.Digest ||
		len(m.Layers) != 1 || m.Layers[0].MediaType != IndexMediaType {
		return nil, errors.New("not an index of this model")
	}
	l := m.Layers[0]
	if l.Size <= 0 || l.Size > DefaultIndexCacheBytes {
		return nil, fmt.Errorf("record of %d bytes", l.Size)
	}
	rec, err := verify.Fetch(ctx, tr.Target, "index", l)
	if err != nil {
		return nil, err
	}
	return decodeRecord(a, rec)
}

// MaxIndexManifestBytes bounds the manifest of a published index.
const MaxIndexManifestBytes = 64 << 10

// PublishIndex derives the index of the model desc in t (reading every
// layer whole, verified) and pushes it as a referrer of desc. It returns
// the descriptor of the referrer's manifest: what a signer signs.
func PublishIndex(ctx context.Context, t oci.Target, desc ocispec.Descriptor) (ocispec.Descriptor, error) {
	a, err := Fetch(ctx, t, desc)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	m, err := Build(ctx, t, a)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	rec, err := encodeRecord(m)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	dsts := []imageview.Dest{t}
	layer := content.NewDescriptorFromBytes(IndexMediaType, rec)
	empty := ocispec.DescriptorEmptyJSON
	for _, blob := range []struct {
		d ocispec.Descriptor
		b []byte
	}{{layer, rec}, {empty, empty.Data}} {
		if _, err := imageview.PushAll(ctx, dsts, blob.d, func() (io.Reader, error) { return strings.NewReader(string(blob.b)), nil }); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("index of %s: %w", desc.Digest, err)
		}
	}
	empty.Data = nil
	subject := ocispec.Descriptor{MediaType: desc.MediaType, Digest: desc.Digest, Size: desc.Size}
	if subject.MediaType == "" {
		subject.MediaType = ocispec.MediaTypeImageManifest
	}
	man := ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: IndexArtifactType,
		Config:       empty,
		Layers:       []ocispec.Descriptor{layer},
		Subject:      &subject,
	}
	b, err := json.Marshal(man)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	md := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, b)
	md.ArtifactType = IndexArtifactType
	if err := imageview.PushReferrer(ctx, dsts, md, b, subject); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("index of %s: %w", desc.Digest, err)
	}
	return md, nil
}
