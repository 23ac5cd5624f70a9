package layout

import (
	"context"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// ForeignOpener opens an artifact of another format (a ModelPack model) as
// a read-only Version: an index built and validated as bdnvol's own, whose
// chunks the returned Version's Chunks fetcher reads out of the artifact's
// blobs. src is the fetcher Open was given.
type ForeignOpener func(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (*Version, error)

// ForeignFormat is a format other than bdnvol's that OpenWith reads as a
// read-only version when its caller names it (OpenOptions.Foreign): the
// caller's imports say which formats it opens.
type ForeignFormat struct {
	// Types are the artifact types of its manifests and, for a manifest
	// without one, the config media types.
	Types []string
	Open  ForeignOpener
}

// Reads reports whether an image manifest of artifactType (and config
// media type configType) is of format f.
func (f ForeignFormat) Reads(artifactType, configType string) bool {
	if artifactType == "" {
		artifactType = configType
	}
	for _, t := range f.Types {
		if t == artifactType {
			return true
		}
	}
	return false
}

// foreignOpener returns the opener of the first of formats that reads a
// manifest of artifactType and config media type configType.
func foreignOpener(formats []ForeignFormat, artifactType, configType string) (ForeignOpener, bool) {
	for _, f := range formats {
		if f.Reads(artifactType, configType) {
			return f.Open, true
		}
	}
	return nil, false
}

// ChunkSource returns the fetcher of the version's chunks given src, the
// fetcher of its repository: src itself for a bdnvol volume, whose chunks
// are blobs; for a foreign artifact, a fetcher that reads each chunk out of
// the artifact's layers (by range where a layer allows it) from src.
func (v *Version) ChunkSource(src content.Fetcher) content.Fetcher {
	if v.Chunks == nil {
		if v.Index != nil {
			return DeltaSource(src, nil, v.Index, nil)
		}
		return src
	}
	return v.Chunks(src)
}

// ChunkSourceBases is ChunkSource with the base chunks of delta chunks read
// through bases (a chunk cache in front of src): a reader that has the
// version before keeps its chunks, and decodes the new version's deltas
// against them.
func (v *Version) ChunkSourceBases(src, bases content.Fetcher) content.Fetcher {
	if v.Chunks == nil && v.Index != nil {
		return DeltaSource(src, bases, v.Index, nil)
	}
	return v.ChunkSource(src)
}

// IsDelta reports whether chunk k of the version is stored as a delta (read
// whole: it has no range of its own in the repository).
func (v *Version) IsDelta(k int) bool {
	_, ok := v.Index.Delta(k)
	return ok
}
