package modelpack

import (
	"context"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// Format is ModelPack as layout.OpenWith reads it (OpenOptions.Foreign):
// manifests of ArtifactType, or of config MediaTypeConfig without one,
// opened with Open.
var Format = layout.ForeignFormat{Types: []string{ArtifactType, MediaTypeConfig}, Open: Open}

// Open reads the model whose manifest is desc into a read-only
// layout.Version (see Build): its index lists the model's files, and its
// ChunkSource reads each chunk out of the layers. Every layer is read once,
// whole, and verified here, unless the process's IndexCache (see
// UseIndexCache) holds the index derived from this manifest before: then
// only the manifest is read.
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
	m, err := Build(ctx, src, a)
	if err != nil {
		return nil, err
	}
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
