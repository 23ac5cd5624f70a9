package layout

import (
	"context"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// ReadParams returns the chunking parameters a push over the version whose
// root is desc inherits (Index.InheritedParams). It reads the manifests up
// to the file index and, for a version 2 index, only its top-level blob,
// not its pieces: a re-push of a million files need not open the version
// before. The bytes read are verified, the version is not otherwise checked.
func ReadParams(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (Params, error) {
	root, err := fetchManifest(ctx, src, desc, maxParts)
	if err != nil {
		return Params{}, err
	}
	v := &Version{Root: desc}
	_, first, err := v.firstPart(ctx, src, root)
	if err != nil {
		return Params{}, err
	}
	x, _, err := v.readIndex(ctx, src, first, true)
	if err != nil {
		return Params{}, err
	}
	if err := x.Chunking.Validate(); err != nil {
		return Params{}, err
	}
	return x.InheritedParams(), nil
}
