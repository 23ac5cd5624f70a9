package signature

import (
	"context"
	"slices"
	"strings"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
)

// Status is whether a version is signed and by which keys.
type Status struct {
	Signed bool `json:"signed"`
	// Claimed are the key ids the signatures name (bdnvol records them; a
	// claim, not a proof). Signatures made by cosign name none.
	Claimed []string `json:"claimed_keys,omitempty"`
	// Verified is the key id of the --key that a signature verifies with.
	Verified string `json:"verified_key,omitempty"`
	// Error says why no signature verified, when keys were given.
	Error string `json:"error,omitempty"`
}

// StatusOf tells whether desc is signed. tagged says whether its signature
// tag exists (from a tag list the caller has): false skips all requests.
// Without keys it reads one small manifest; with keys it verifies.
func StatusOf(ctx context.Context, t oras.ReadOnlyGraphTarget, desc ocispec.Descriptor, tagged bool, keys []Verifier) Status {
	var s Status
	if len(keys) > 0 {
		v, err := Verify(ctx, t, desc, keys)
		if err != nil {
			s.Error = err.Error()
		} else {
			s.Verified = v.KeyID
		}
	}
	if !tagged && s.Verified == "" {
		return s
	}
	md, err := t.Resolve(ctx, Tag(desc.Digest))
	if err != nil {
		s.Signed = s.Verified != ""
		return s
	}
	s.Signed = true
	if m, err := fetchManifest(ctx, t, md); err == nil {
		for _, l := range m.Layers {
			if id := l.Annotations[AnnotationKeyID]; id != "" && !slices.Contains(s.Claimed, id) {
				s.Claimed = append(s.Claimed, id)
			}
		}
	}
	return s
}

// String is the short form for tables: "-", "yes", "key <id>" or "verified <id>".
// A claimed id is the repository's text: one a terminal would act on is
// quoted (termsafe.Name).
func (s Status) String() string {
	switch {
	case s.Verified != "":
		return "verified " + termsafe.Name(short(s.Verified))
	case !s.Signed:
		return "-"
	case len(s.Claimed) > 0:
		ids := make([]string, len(s.Claimed))
		for i, id := range s.Claimed {
			ids[i] = termsafe.Name(short(id))
		}
		return "key " + strings.Join(ids, ",")
	}
	return "yes"
}

// Statuses tells for each version of ds in t whether it is signed: one tag
// list, then one small fetch per signed version (verifications with p's
// keys; with a policy that requires a signature, unsigned versions are
// checked too).
func Statuses(ctx context.Context, t oci.Target, ds []digest.Digest, p Policy) ([]Status, error) {
	tags, err := oci.ListTags(ctx, t)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, tag := range tags {
		have[tag] = true
	}
	out := make([]Status, len(ds))
	for i, d := range ds {
		tagged := have[Tag(d)]
		if !tagged && !p.Required() {
			continue
		}
		desc, err := t.Resolve(ctx, d.String())
		if err != nil {
			return nil, err
		}
		out[i] = StatusOf(ctx, t, desc, tagged, p.Keys)
	}
	return out, nil
}
