package warmstate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// ArtifactType is the artifact type of a companion's index.
const ArtifactType = "application/vnd.bdnvol.warmstate.v1"

// Annotations of a companion's index.
const (
	// AnnotationKey holds the canonical key (Key.String).
	AnnotationKey = "dev.bdnvol.warmstate.key"
	// AnnotationFieldPrefix starts one annotation per key field, for
	// tools that read fields; they must agree with AnnotationKey.
	AnnotationFieldPrefix = "dev.bdnvol.warmstate.key."
)

// MaxCompanions bounds the companions of one version List reads.
const MaxCompanions = 256

var (
	// ErrNotFound is wrapped when no companion has the key asked for.
	ErrNotFound = errors.New("no warm-state companion with this key")
	// ErrInvalid is wrapped when a referrer of the companion type is malformed.
	ErrInvalid = errors.New("invalid warm-state companion")
	// ErrTooMany is wrapped when a version has more than MaxCompanions.
	ErrTooMany = errors.New("too many warm-state companions")
)

// Companion is a warm-state companion of a version as List reads it.
type Companion struct {
	Desc    ocispec.Descriptor // the companion's index
	Subject digest.Digest      // the version it belongs to
	Tree    ocispec.Descriptor // the sealed tree's root
	Key     Key
	Err     error // why it is invalid (then only Desc is set)
}

// Encode returns the companion index of the tree root for the version
// subject under key: the same inputs, the same bytes.
func Encode(subject, tree ocispec.Descriptor, key Key) ([]byte, error) {
	ann := map[string]string{AnnotationKey: key.String()}
	for name, v := range key {
		ann[AnnotationFieldPrefix+name] = v
	}
	if tree.ArtifactType == "" {
		tree.ArtifactType = layout.ArtifactTypeVolume
	}
	idx := ocispec.Index{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageIndex,
		ArtifactType: ArtifactType,
		Manifests: []ocispec.Descriptor{{
			MediaType: tree.MediaType, Digest: tree.Digest, Size: tree.Size, ArtifactType: tree.ArtifactType,
		}},
		Subject:     &ocispec.Descriptor{MediaType: subject.MediaType, Digest: subject.Digest, Size: subject.Size},
		Annotations: ann,
	}
	return json.Marshal(idx)
}

// Decode reads a companion index (its bytes, verified against d) that
// must belong to subject.
func Decode(d ocispec.Descriptor, b []byte, subject digest.Digest) (Companion, error) {
	c := Companion{Desc: d}
	var idx ocispec.Index
	if err := json.Unmarshal(b, &idx); err != nil {
		return c, fmt.Errorf("%w %s: %v", ErrInvalid, d.Digest, err)
	}
	if idx.MediaType != ocispec.MediaTypeImageIndex || idx.ArtifactType != ArtifactType {
		return c, fmt.Errorf("%w %s: media type %q, artifact type %q", ErrInvalid, d.Digest, idx.MediaType, idx.ArtifactType)
	}
	if idx.Subject == nil || idx.Subject.Digest != subject {
		return c, fmt.Errorf("%w %s: not a companion of %s", ErrInvalid, d.Digest, subject)
	}
	if len(idx.Manifests) != 1 || !oci.IsManifest(idx.Manifests[0].MediaType) || idx.Manifests[0].ArtifactType != layout.ArtifactTypeVolume {
		return c, fmt.Errorf("%w %s: want one manifest of artifact type %s", ErrInvalid, d.Digest, layout.ArtifactTypeVolume)
	}
	if err := idx.Manifests[0].Digest.Validate(); err != nil {
		return c, fmt.Errorf("%w %s: tree: %v", ErrInvalid, d.Digest, err)
	}
	key, err := ParseKey(idx.Annotations[AnnotationKey])
	if err != nil {
		return c, fmt.Errorf("%w %s: %w", ErrInvalid, d.Digest, err)
	}
	if key.String() != idx.Annotations[AnnotationKey] {
		return c, fmt.Errorf("%w %s: key %q is not canonical", ErrInvalid, d.Digest, idx.Annotations[AnnotationKey])
	}
	n := 0
	for a, v := range idx.Annotations {
		name, ok := strings.CutPrefix(a, AnnotationFieldPrefix)
		if !ok {
			continue
		}
		n++
		if key[name] != v {
			return c, fmt.Errorf("%w %s: annotation %s=%q disagrees with its key", ErrInvalid, d.Digest, a, v)
		}
	}
	if n != len(key) {
		return c, fmt.Errorf("%w %s: %d field annotations for %d fields", ErrInvalid, d.Digest, n, len(key))
	}
	c.Subject, c.Tree, c.Key = subject, idx.Manifests[0], key
	return c, nil
}

// List returns the companions attached to the version subject in t,
// sorted by digest, invalid ones with Err set. It asks the referrers API,
// or the tag schema where the registry lacks it (oci.EachReferrer), and
// reads each companion's index itself: a listing's annotations are not
// trusted. More than MaxCompanions is an error wrapping ErrTooMany.
func List(ctx context.Context, t oci.Target, subject ocispec.Descriptor) ([]Companion, error) {
	var refs []ocispec.Descriptor
	// Listed unfiltered and filtered here: some registries report an
	// index's artifact type as its (absent) config's media type, "".
	err := oci.EachReferrer(ctx, t, subject, "", func(d ocispec.Descriptor) error {
		if d.ArtifactType != ArtifactType && (d.ArtifactType != "" || d.MediaType != ocispec.MediaTypeImageIndex) {
			return nil
		}
		if len(refs) == MaxCompanions {
			return fmt.Errorf("%s: %w: more than %d", subject.Digest, ErrTooMany, MaxCompanions)
		}
		refs = append(refs, d)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(refs, func(a, b ocispec.Descriptor) int { return strings.Compare(string(a.Digest), string(b.Digest)) })
	out := make([]Companion, 0, len(refs))
	for _, r := range refs {
		c, err := read(ctx, t, r, subject.Digest)
		if errors.Is(err, oci.ErrNotFound) {
			continue // deleted since the listing
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		c.Err = err
		out = append(out, c)
	}
	return out, nil
}

func read(ctx context.Context, t oci.Target, r ocispec.Descriptor, subject digest.Digest) (Companion, error) {
	r = ocispec.Descriptor{MediaType: r.MediaType, Digest: r.Digest, Size: r.Size, ArtifactType: r.ArtifactType}
	if r.MediaType != ocispec.MediaTypeImageIndex || r.Size <= 0 || r.Size > oci.MaxManifestBytes {
		return Companion{Desc: r}, fmt.Errorf("%w %s: %s of %d bytes", ErrInvalid, r.Digest, r.MediaType, r.Size)
	}
	b, err := verify.Fetch(ctx, t, "", r)
	if err != nil {
		return Companion{Desc: r}, err
	}
	return Decode(r, b, subject)
}

// Matches returns the valid companions of cs whose key equals key.
func Matches(cs []Companion, key Key) []Companion {
	var out []Companion
	for _, c := range cs {
		if c.Err == nil && c.Key.Equal(key) {
			out = append(out, c)
		}
	}
	return out
}

// Find returns the companion of the version subject in t whose key equals
// key, every field; an error wrapping ErrNotFound when none does. Under a
// policy that requires signatures, only a companion whose index digest
// carries one counts (the key is in that index, so a key changed after
// signing is another, unsigned digest); when companions match but none is
// signed, the error wraps signature.ErrRefused. Of several that count, the
// one of the lowest digest is returned (the one Publish keeps).
func Find(ctx context.Context, t oci.Target, subject ocispec.Descriptor, key Key, p signature.Policy) (*Companion, error) {
	cs, err := List(ctx, t, subject)
	if err != nil {
		return nil, err
	}
	return pick(ctx, t, Matches(cs, key), subject, key, p)
}

func pick(ctx context.Context, t oci.Target, ms []Companion, subject ocispec.Descriptor, key Key, p signature.Policy) (*Companion, error) {
	var errs []error
	for _, c := range ms {
		if err := p.Check(ctx, t, c.Desc); err != nil {
			errs = append(errs, fmt.Errorf("companion %s: %w", c.Desc.Digest, err))
			continue
		}
		return &c, nil
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return nil, fmt.Errorf("%s: %w %s", subject.Digest, ErrNotFound, key)
}

// pushBytes stores b (of descriptor d) in t unless it is there.
func pushBytes(ctx context.Context, t oci.Target, d ocispec.Descriptor, b []byte) error {
	if ok, err := t.Exists(ctx, d); err == nil && ok {
		return nil
	}
	if err := t.Push(ctx, d, strings.NewReader(string(b))); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) && !danglingIndexGone(err) {
		return fmt.Errorf("push %s %s: %w", d.MediaType, d.Digest, err)
	}
	return nil
}

// danglingIndexGone reports whether err is only the referrers tag
// schema's clean-up failing because another publisher removed the old
// referrers index first: the manifest and the new index are stored and
// tagged by then (two ranks publishing companions of one version at once).
func danglingIndexGone(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "failed to delete dangling referrers index") && strings.HasSuffix(msg, "not found")
}

// Attach stores the companion index of tree (already stored in t) for the
// version subject under key and returns its descriptor. The same inputs
// give the same digest; nothing already stored is changed.
func Attach(ctx context.Context, t oci.Target, subject, tree ocispec.Descriptor, key Key) (ocispec.Descriptor, error) {
	b, err := Encode(subject, tree, key)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	d := content.NewDescriptorFromBytes(ocispec.MediaTypeImageIndex, b)
	d.ArtifactType = ArtifactType
	// Asking first keeps the push from also writing the tag-schema index
	// where the registry lists referrers itself.
	served, err := oci.ServesReferrers(ctx, t, subject)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("companion of %s: %w", subject.Digest, err)
	}
	start := time.Now()
	if err := pushBytes(ctx, t, d, b); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("companion of %s: %w", subject.Digest, err)
	}
	if !served {
		if err := keepListed(ctx, t, subject, d, b, time.Since(start)); err != nil {
			return ocispec.Descriptor{}, err
		}
	}
	return d, nil
}

// relistTries bounds how often keepListed pushes a companion again.
const relistTries = 8

// keepListed makes sure subject's referrers list the companion d (its
// bytes b), which took took to push. Under the referrers tag schema each
// publisher reads the one referrers index, adds its own and writes it
// back, so two publishing at once (the ranks of one start) can each write
// an index without the other's companion; pushing the manifest again adds
// it back. It is listed when two listings, a push's time apart or more,
// both show it: a write begun before the first has landed by the second.
func keepListed(ctx context.Context, t oci.Target, subject, d ocispec.Descriptor, b []byte, took time.Duration) error {
	wait := 10 * time.Millisecond
	gap := max(2*took, 20*time.Millisecond)
	seen := 0
	for try := 1; ; {
		listed := false
		err := oci.EachReferrer(ctx, t, subject, "", func(r ocispec.Descriptor) error {
			listed = listed || r.Digest == d.Digest
			return nil
		})
		if err != nil {
			return err
		}
		if listed {
			if seen++; seen == 2 {
				return nil
			}
			if err := sleep(ctx, gap); err != nil {
				return err
			}
			continue
		}
		seen = 0
		if try == relistTries {
			return fmt.Errorf("companion %s of %s: stored, but not listed among its referrers after %d pushes (others rewriting the referrers tag at once)", d.Digest, subject.Digest, try)
		}
		try++
		// Apart from the others' next writes: a random wait, doubling.
		if err := sleep(ctx, wait+rand.N(wait)); err != nil {
			return err
		}
		wait *= 2
		start := time.Now()
		if err := t.Push(ctx, d, bytes.NewReader(b)); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) && !danglingIndexGone(err) {
			return fmt.Errorf("push %s %s: %w", d.MediaType, d.Digest, err)
		}
		gap = max(gap, 2*time.Since(start))
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// Delete deletes the companion c (its index, by digest) and its
// signatures. The tree's manifests and chunks stay for the registry's
// garbage collector.
func Delete(ctx context.Context, t oci.Target, c ocispec.Descriptor) error {
	if _, err := signature.Delete(ctx, t, c); err != nil {
		return err
	}
	if err := t.Delete(ctx, c); err != nil && !errors.Is(err, oci.ErrNotFound) {
		return fmt.Errorf("delete companion %s: %w", c.Digest, err)
	}
	return nil
}
