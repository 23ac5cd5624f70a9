package versions

import (
	"context"
	"errors"
	"fmt"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// TagHistory is where a tag points now and where it pointed before.
type TagHistory struct {
	Tag     string        `json:"tag"`
	Current digest.Digest `json:"current,omitempty"` // where the tag points now; empty when it is gone
	Moves   []Move        `json:"moves"`             // oldest first
}

// MovedOutside reports whether the tag points at another version than its
// last recorded move left it at: it was moved without bdnvol.
func (h *TagHistory) MovedOutside() bool {
	var last digest.Digest
	if n := len(h.Moves); n > 0 {
		last = h.Moves[n-1].Digest
	}
	return h.Current != "" && h.Current != last
}

// ReadTagHistory reads the recorded moves of the tag ref names and where it
// points now. A tag that is not there and has no recorded moves is
// oci.ErrNotFound.
func ReadTagHistory(ctx context.Context, t oci.Target, ref oci.Ref) (*TagHistory, error) {
	h, err := ReadHistory(ctx, t, ref.Tag)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	out := &TagHistory{Tag: ref.Tag, Moves: h.Moves}
	cur, err := t.Resolve(ctx, ref.Tag)
	switch {
	case errors.Is(err, oci.ErrNotFound):
	case err != nil:
		return nil, fmt.Errorf("%s: %w", ref, err)
	default:
		out.Current = cur.Digest
	}
	if len(h.Moves) == 0 && out.Current == "" {
		return nil, fmt.Errorf("%s: %w: no such tag and no recorded moves", ref, oci.ErrNotFound)
	}
	return out, nil
}
