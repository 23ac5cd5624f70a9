package modelpack

import (
	"context"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// Format is ModelPack as layout.OpenWith reads it (OpenOptions.Foreign):
// manifests of ArtifactType, or of config MediaTypeConfig without one (and
// the same names before the format moved to the CNCF), opened with Open.
var Format = layout.ForeignFormat{Types: []string{ArtifactType, MediaTypeConfig, LegacyArtifactType, LegacyMediaTypeConfig}, Open: Open}

// Open reads the model whose manifest is desc into a read-only
// layout.Version (see Build): its index lists the model's files, and its
// ChunkSource reads each chunk out of the layers. Every layer is read once,
// whole, and verified here, unless the process's IndexCache (see
// UseIndexCache) holds the index derived from this manifest before, or ctx
// carries a Trust (WithTrust) whose policy's key signed an index published
// beside the model (PublishIndex): then only the manifest (and the
// published index) is read.
func Open(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (*layout.Version, error) {
	return OpenCached(ctx, src, desc, processCache.Load())
}

// OpenCached is Open with the index cache c (nil: none).
func OpenCached(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor, c *IndexCache) (*layout.Version, error) {
	a, err := Fetch(ctx, src, desc)
	if err != nil {
		return nil, err
	}
	if c != nil {
		c = c.For(originOf(src))
		if m, ok := c.Load(a); ok {
			return m.Version(), nil
		}
	}
	if tr := trustOf(ctx); tr != nil {
		m, err := tr.published(ctx, a)
		if err == nil {
			// Not kept in c: the next open checks the signature again.
			published.Add(1)
			tr.logf("modelpack %s: index from a signed published index; layers are read by range as readers ask", a.Desc.Digest)
			return m.Version(), nil
		}
		tr.logf("modelpack %s: no trusted published index (%v): reading its %d layers whole to derive it", a.Desc.Digest, err, len(a.Layers))
	}
	m, err := Build(ctx, src, a)
	if err != nil {
		return nil, err
	}
	derived.Add(1)
	if c != nil {
		_ = c.Store(m) // a cache that cannot be written costs the next open a read of the layers, nothing else
	}
	return m.Version(), nil
}

// originOf returns the origin src reads for (a chunk cache's view says
// it), "" when it does not say.
func originOf(src content.Fetcher) string {
	if o, ok := src.(interface{ Origin() string }); ok {
		return o.Origin()
	}
	return ""
}

// Version returns the map as a read-only version.
func (m *Map) Version() *layout.Version {
	meta := []ocispec.Descriptor{m.Artifact.Desc}
	if m.Artifact.Manifest.Config.Digest != "" {
		meta = append(meta, m.Artifact.Manifest.Config)
	}
	streamed := map[string]bool{}
	for _, f := range m.Files {
		if !f.Lazy {
			streamed[f.Path] = true
		}
	}
	return &layout.Version{
		Streamed: streamed,
		Root:     m.Artifact.Desc,
		Index:    m.Index,
		Meta:     meta,
		Foreign:  ArtifactType,
		Chunks:   m.Fetcher,
	}
}
