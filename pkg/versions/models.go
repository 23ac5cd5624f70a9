package versions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/origin"
)

// Model is a foreign artifact bdnvol reads as a version (a ModelPack
// model) that a human tag of the repository names and that is not one of
// its sealed versions. Models have no protective tag: retention (List,
// and so gc) never sees them, and never deletes them.
type Model struct {
	Digest  digest.Digest `json:"digest"`
	Foreign string        `json:"foreign"` // its artifactType (or config media type)
	Bytes   int64         `json:"bytes"`   // the sizes of its layers
	Layers  int           `json:"layers"`
	Tags    []string      `json:"tags"` // sorted
}

// ListModels returns the models the human tags of t name, leaving out the
// digests in skip (the sealed versions already listed), by digest. It
// fetches the manifest of every other tagged digest once; a tag naming
// something else (an image, a manifest that does not parse) is left out.
func ListModels(ctx context.Context, t oci.Target, skip map[digest.Digest]bool) ([]Model, error) {
	tags, err := oci.ListTags(ctx, t)
	if err != nil {
		return nil, fmt.Errorf("list tags: %w", err)
	}
	human, err := tagsOf(ctx, t, tags)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var out []Model
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(jobs)
	opts := oras.DefaultFetchBytesOptions
	opts.MaxBytes = layout.MaxManifestBytes
	for d, ts := range human {
		if skip[d] {
			continue
		}
		g.Go(func() error {
			desc, b, err := oras.FetchBytes(gctx, t, d.String(), opts)
			if errors.Is(err, errdef.ErrNotFound) {
				return nil // deleted since the listing
			}
			if err != nil {
				if gctx.Err() != nil {
					return gctx.Err()
				}
				return nil // unreadable: not listed as a model
			}
			if desc.Digest != d {
				return nil
			}
			var m ocispec.Manifest
			if json.Unmarshal(b, &m) != nil || m.MediaType != ocispec.MediaTypeImageManifest || !origin.IsForeign(m.ArtifactType, m.Config.MediaType) {
				return nil
			}
			md := Model{Digest: d, Foreign: m.ArtifactType, Layers: len(m.Layers), Tags: ts}
			if md.Foreign == "" {
				md.Foreign = m.Config.MediaType
			}
			for _, l := range m.Layers {
				if l.Size > 0 {
					md.Bytes += l.Size
				}
			}
			mu.Lock()
			out = append(out, md)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Model) int { return strings.Compare(a.Tags[0], b.Tags[0]) })
	return out, nil
}
