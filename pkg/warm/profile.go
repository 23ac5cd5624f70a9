package warm

import (
	"context"
	"errors"
	"slices"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/profile"
)

// profileFirst puts the chunks of t the version's startup profile lists
// first in t.Need, in the profile's order; the rest keep theirs. With no
// profile (or one of another version) t is left as it is.
func (t *Opened) profileFirst(ctx context.Context, tgt oci.Target, opt profile.Options) {
	p, _, err := profile.Find(ctx, tgt, t.Version.Root, opt)
	if err != nil {
		if !errors.Is(err, profile.ErrNotFound) && opt.Logf != nil {
			opt.Logf("profile of %s not used: %v", t.Version.Root.Digest, err)
		}
		return
	}
	order, err := p.Order(t.Version)
	if err != nil {
		return
	}
	rank := make(map[string]int, len(order))
	for i, k := range order {
		rank[string(t.Version.Index.ChunkDigest(k))] = i
	}
	slices.SortStableFunc(t.Need, func(a, b ocispec.Descriptor) int {
		ra, oka := rank[string(a.Digest)]
		rb, okb := rank[string(b.Digest)]
		switch {
		case oka && okb:
			return ra - rb
		case oka:
			return -1
		case okb:
			return 1
		}
		return 0
	})
}
