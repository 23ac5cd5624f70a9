package layout

import (
	"context"
	"sync"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// ForeignOpener opens an artifact of another format (a ModelPack model) as
// a read-only Version: an index built and validated as bdnvol's own, whose
// chunks the returned Version's Chunks fetcher reads out of the artifact's
// blobs. src is the fetcher Open was given.
type ForeignOpener func(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (*Version, error)

var (
	foreignMu sync.RWMutex
	foreign   = map[string]ForeignOpener{}
)

// RegisterForeign makes Open read image manifests of artifactType (or,
// without one, of that config media type) with open, instead of refusing them as not a volume. A package that reads
// another format registers itself in its init.
func RegisterForeign(artifactType string, open ForeignOpener) {
	foreignMu.Lock()
	defer foreignMu.Unlock()
	foreign[artifactType] = open
}

// foreignOpener returns the opener registered for a manifest's
// artifactType or, when it has none, its config's media type.
func foreignOpener(artifactType, configType string) (ForeignOpener, bool) {
	foreignMu.RLock()
	defer foreignMu.RUnlock()
	if artifactType == "" {
		artifactType = configType
	}
	open, ok := foreign[artifactType]
	return open, ok
}

// IsForeign reports whether a manifest of artifactType (and config media
// type configType) is a foreign artifact Open reads.
func IsForeign(artifactType, configType string) bool {
	_, ok := foreignOpener(artifactType, configType)
	return ok
}

// ChunkSource returns the fetcher of the version's chunks given src, the
// fetcher of its repository: src itself for a bdnvol volume, whose chunks
// are blobs; for a foreign artifact, a fetcher that reads each chunk out of
// the artifact's layers (by range where a layer allows it) from src.
func (v *Version) ChunkSource(src content.Fetcher) content.Fetcher {
	if v.Chunks == nil {
		return src
	}
	return v.Chunks(src)
}
