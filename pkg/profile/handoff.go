package profile

import (
	"context"
	"errors"
	"fmt"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// Lookup is the outcome of looking for a version's profile referrer
// (Fetch) in one process, handed to the mount of that version in another
// (Options.Handed), so that the mount asks the registry nothing for it.
type Lookup struct {
	// Version is the digest of the version's root the lookup was for.
	Version digest.Digest `json:"version"`
	// Doc is the profile document found, every byte verified against
	// its digest; the mount parses it again (Parse's bounds).
	Doc []byte `json:"doc,omitempty"`
	// NotFound says no profile is attached (ErrNotFound).
	NotFound bool `json:"notFound,omitempty"`
	// Err is why the lookup failed, when it did.
	Err string `json:"err,omitempty"`
}

// Look runs Fetch for the version whose root is subject in t and returns
// its outcome for another process; false when ctx ended first (nothing to
// hand: the mount looks itself).
func Look(ctx context.Context, t oci.Target, subject ocispec.Descriptor) (Lookup, bool) {
	p, err := Fetch(ctx, t, subject)
	if ctx.Err() != nil {
		return Lookup{}, false
	}
	l := Lookup{Version: subject.Digest}
	switch {
	case err == nil:
		l.Doc = p.Encode()
	case errors.Is(err, ErrNotFound):
		l.NotFound = true
	default:
		l.Err = err.Error()
	}
	return l, true
}

// result is what Fetch gave in the process that looked, for the version
// whose root digest is root.
func (l Lookup) result(root digest.Digest) (*Profile, error) {
	switch {
	case l.Doc != nil:
		p, err := Parse(l.Doc)
		if err == nil && p.Version != root {
			err = fmt.Errorf("%w: %s", ErrOtherVersion, p.Version)
		}
		return p, err
	case l.NotFound:
		return nil, fmt.Errorf("%s: %w", root, ErrNotFound)
	case l.Err != "":
		return nil, errors.New(l.Err)
	}
	return nil, fmt.Errorf("%w: an empty handed-off lookup", ErrInvalid)
}
