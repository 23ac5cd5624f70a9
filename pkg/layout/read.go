package layout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// ErrNotVolume is wrapped when a manifest is not a bdnvol volume.
var ErrNotVolume = errors.New("not a bdnvol volume")

// maxParts bounds the part manifests of one version (each holds up to
// DefaultMaxLayers chunks: far beyond a petabyte).
const maxParts = 20000

// Version is a sealed version opened for reading: its root, its validated
// index, and its chunk descriptors in index order.
type Version struct {
	Root   ocispec.Descriptor
	Index  *Index
	Chunks []ocispec.Descriptor
}

// Open fetches and validates the manifests and file index of the version
// whose root is desc. Every byte fetched is verified against its digest.
func Open(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (*Version, error) {
	root, err := fetchManifest(ctx, src, desc)
	if err != nil {
		return nil, err
	}
	var layers []ocispec.Descriptor
	switch root.MediaType {
	case ocispec.MediaTypeImageManifest:
		if root.ArtifactType != ArtifactTypeVolume {
			return nil, fmt.Errorf("%s: artifactType %q: %w", desc.Digest, root.ArtifactType, ErrNotVolume)
		}
		layers = root.Layers
	case ocispec.MediaTypeImageIndex:
		if root.ArtifactType != ArtifactTypeVolume {
			return nil, fmt.Errorf("%s: artifactType %q: %w", desc.Digest, root.ArtifactType, ErrNotVolume)
		}
		if len(root.Manifests) == 0 || len(root.Manifests) > maxParts {
			return nil, fmt.Errorf("%s: %w: %d part manifests", desc.Digest, ErrInvalidIndex, len(root.Manifests))
		}
		for _, pd := range root.Manifests {
			part, err := fetchManifest(ctx, src, pd)
			if err != nil {
				return nil, err
			}
			if part.MediaType != ocispec.MediaTypeImageManifest || part.ArtifactType != ArtifactTypePart {
				return nil, fmt.Errorf("part %s of %s: %w: not a part manifest", pd.Digest, desc.Digest, ErrInvalidIndex)
			}
			if len(layers)+len(part.Layers) > MaxChunks+1 {
				return nil, fmt.Errorf("%s: %w: too many layers", desc.Digest, ErrInvalidIndex)
			}
			layers = append(layers, part.Layers...)
		}
	default:
		return nil, fmt.Errorf("%s: media type %q: %w", desc.Digest, root.MediaType, ErrNotVolume)
	}
	if len(layers) == 0 || layers[0].MediaType != MediaTypeIndex {
		return nil, fmt.Errorf("%s: %w: first layer is not a file index", desc.Digest, ErrNotVolume)
	}
	if layers[0].Size <= 0 || layers[0].Size > MaxIndexBytes {
		return nil, fmt.Errorf("%s: %w: file index of %d bytes", desc.Digest, ErrInvalidIndex, layers[0].Size)
	}
	b, err := fetchAll(ctx, src, layers[0])
	if err != nil {
		return nil, fmt.Errorf("file index %s of %s: %w", layers[0].Digest, desc.Digest, err)
	}
	x, err := DecodeIndex(b)
	if err != nil {
		return nil, fmt.Errorf("file index %s of %s: %w", layers[0].Digest, desc.Digest, err)
	}
	chunks := layers[1:]
	if len(chunks) != len(x.Chunks) {
		return nil, fmt.Errorf("%s: %w: %d chunk layers for %d chunks", desc.Digest, ErrInvalidIndex, len(chunks), len(x.Chunks))
	}
	for i, c := range x.Chunks {
		if chunks[i].Digest != c.Digest || chunks[i].Size != c.Size || chunks[i].MediaType != MediaTypeChunk {
			return nil, fmt.Errorf("%s: %w: layer %d (%s) does not match chunk %s", desc.Digest, ErrInvalidIndex, i+1, chunks[i].Digest, c.Digest)
		}
	}
	return &Version{Root: desc, Index: x, Chunks: chunks}, nil
}

// manifestOrIndex holds the fields of a manifest or an index that Open reads.
type manifestOrIndex struct {
	MediaType    string               `json:"mediaType"`
	ArtifactType string               `json:"artifactType"`
	Layers       []ocispec.Descriptor `json:"layers"`
	Manifests    []ocispec.Descriptor `json:"manifests"`
}

func fetchManifest(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (*manifestOrIndex, error) {
	if desc.Size <= 0 || desc.Size > MaxManifestBytes {
		return nil, fmt.Errorf("manifest %s: %w: size %d", desc.Digest, ErrInvalidIndex, desc.Size)
	}
	b, err := fetchAll(ctx, src, desc)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	var m manifestOrIndex
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest %s: %w: %v", desc.Digest, ErrNotVolume, err)
	}
	if m.MediaType == "" {
		m.MediaType = desc.MediaType
	}
	return &m, nil
}

// fetchAll fetches and verifies a whole blob, fetching it again when the
// body is cut short or its bytes do not match (bounded, like chunks).
func fetchAll(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) ([]byte, error) {
	for attempt := 1; ; attempt++ {
		b, err := content.FetchAll(ctx, src, desc)
		if err == nil {
			return b, nil
		}
		if attempt >= fetchAttempts || !refetchable(ctx, err) {
			if errors.Is(err, content.ErrMismatchedDigest) {
				err = fmt.Errorf("%w: %v", ErrDigestMismatch, err)
			}
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
}
