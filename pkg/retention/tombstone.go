package retention

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// Tombstone format; docs/retention.md is the contract.
const (
	// ArtifactTypeTombstone is the artifactType of a tombstone index.
	ArtifactTypeTombstone = "application/vnd.bdnvol.tombstone.v1"
	// DeletedTagPrefix starts every tombstone tag.
	DeletedTagPrefix = oci.DeletedTagPrefix
	// AnnotationVersion names the deleted version's digest.
	AnnotationVersion = "io.bdnvol.tombstone.version"
	// AnnotationDeleted is the RFC 3339 time of the deletion.
	AnnotationDeleted = "io.bdnvol.tombstone.deleted"
	// AnnotationSealed is the RFC 3339 time the version was first sealed.
	AnnotationSealed = "io.bdnvol.tombstone.sealed"
	// AnnotationTags is a JSON array of the human tags the version had.
	AnnotationTags = "io.bdnvol.tombstone.tags"
)

// Errors.
var (
	// ErrNotLive is wrapped when a version to delete has no protective tag
	// pointing at it (already deleted, or never sealed).
	ErrNotLive = errors.New("not a live version")
	// ErrKept is wrapped when a re-check right before a deletion finds a
	// reason to keep the version.
	ErrKept = errors.New("kept")
	// ErrNoTombstone is wrapped when restore finds no deleted version.
	ErrNoTombstone = errors.New("no deleted version")
)

// jobs bounds concurrent registry requests.
const jobs = 8

// DeletedTag returns the tombstone tag of version d deleted at t.
func DeletedTag(d digest.Digest, t time.Time) string { return oci.TimedTag(DeletedTagPrefix, d, t) }

// ParseDeletedTag returns the deletion time and digest prefix of a
// tombstone tag.
func ParseDeletedTag(tag string) (time.Time, string, bool) {
	return oci.ParseTimedTag(DeletedTagPrefix, tag)
}

// isHuman reports whether tag is a human tag rather than one of bdnvol's.
func isHuman(tag string) bool {
	return !versions.IsReserved(tag) && !strings.HasPrefix(tag, DeletedTagPrefix)
}

// tombstoneBytes encodes the tombstone of root.
func tombstoneBytes(root ocispec.Descriptor, deleted, sealed time.Time, tags []string) ([]byte, error) {
	tj, err := json.Marshal(nonNil(tags))
	if err != nil {
		return nil, err
	}
	child := ocispec.Descriptor{MediaType: root.MediaType, Digest: root.Digest, Size: root.Size, ArtifactType: layout.ArtifactTypeVolume}
	idx := ocispec.Index{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageIndex,
		ArtifactType: ArtifactTypeTombstone,
		Manifests:    []ocispec.Descriptor{child},
		Annotations: map[string]string{
			AnnotationVersion:         root.Digest.String(),
			AnnotationDeleted:         deleted.UTC().Format(time.RFC3339Nano),
			AnnotationSealed:          sealed.UTC().Format(time.RFC3339),
			AnnotationTags:            string(tj),
			ocispec.AnnotationCreated: deleted.UTC().Format(time.RFC3339Nano),
		},
	}
	return json.Marshal(idx)
}

// parseTombstone reads a tombstone; tag is the tombstone tag it was found by.
func parseTombstone(desc ocispec.Descriptor, b []byte, tag string) (*Deleted, error) {
	var idx ocispec.Index
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("tombstone %s: %w", tag, err)
	}
	if idx.MediaType != ocispec.MediaTypeImageIndex || idx.ArtifactType != ArtifactTypeTombstone || len(idx.Manifests) != 1 {
		return nil, fmt.Errorf("tombstone %s: not a bdnvol tombstone", tag)
	}
	root := idx.Manifests[0]
	if err := root.Digest.Validate(); err != nil || root.Digest.String() != idx.Annotations[AnnotationVersion] {
		return nil, fmt.Errorf("tombstone %s: names %q and %q", tag, root.Digest, idx.Annotations[AnnotationVersion])
	}
	when, hex, _ := ParseDeletedTag(tag)
	if hex != root.Digest.Encoded()[:12] {
		return nil, fmt.Errorf("tombstone %s names %s", tag, root.Digest)
	}
	r := &Deleted{Digest: root.Digest, Deleted: when, Tag: tag, Tombstone: desc, Root: root, Tags: []string{}}
	r.Tombstone.MediaType = ocispec.MediaTypeImageIndex
	if t, err := time.Parse(time.RFC3339Nano, idx.Annotations[AnnotationDeleted]); err == nil {
		r.Deleted = t
	}
	if t, err := time.Parse(time.RFC3339, idx.Annotations[AnnotationSealed]); err == nil {
		r.Sealed = t
	}
	_ = json.Unmarshal([]byte(idx.Annotations[AnnotationTags]), &r.Tags)
	return r, nil
}

// state is what the tags of a repository say about one version now.
type state struct {
	sealed []string // protective tags pointing at it
	human  []string // human tags pointing at it
}

// stateOf lists the tags of t and returns, for the version d, the protective
// and human tags that point at it now.
func stateOf(ctx context.Context, t oci.Target, d digest.Digest) (state, error) {
	tags, err := oci.ListTags(ctx, t)
	if err != nil {
		return state{}, fmt.Errorf("list tags: %w", err)
	}
	var cand []string
	for _, tag := range tags {
		if _, hex, ok := oci.ParseProtectiveTag(tag); ok && hex == d.Encoded()[:12] || isHuman(tag) {
			cand = append(cand, tag)
		}
	}
	res, err := versions.ResolveTags(ctx, t, cand)
	if err != nil {
		return state{}, err
	}
	var s state
	for tag, desc := range res {
		if desc.Digest != d {
			continue
		}
		if isHuman(tag) {
			s.human = append(s.human, tag)
		} else {
			s.sealed = append(s.sealed, tag)
		}
	}
	slices.Sort(s.sealed)
	slices.Sort(s.human)
	return s, nil
}

// ListDeleted returns the tombstones of the repository, oldest deletion
// first. A tombstone whose version has been sealed again has Live set; one
// whose version's root is gone has Gone set.
func ListDeleted(ctx context.Context, t oci.Target) ([]Deleted, error) {
	tags, err := oci.ListTags(ctx, t)
	if err != nil {
		return nil, fmt.Errorf("list tags: %w", err)
	}
	var mu sync.Mutex
	var out []Deleted
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(jobs)
	for _, tag := range tags {
		if _, _, ok := ParseDeletedTag(tag); !ok {
			continue
		}
		g.Go(func() error {
			desc, b, err := oras.FetchBytes(gctx, t, tag, oras.FetchBytesOptions{MaxBytes: layout.MaxManifestBytes})
			if errors.Is(err, errdef.ErrNotFound) {
				return nil // purged since the listing
			}
			if err != nil {
				return fmt.Errorf("%s: %w", tag, err)
			}
			r, err := parseTombstone(desc, b, tag)
			if err != nil {
				return nil // not ours
			}
			if root, err := versions.Stat(gctx, t, r.Root); err == nil {
				r.Bytes, r.Files = root.Bytes, root.Files
			} else if errors.Is(err, errdef.ErrNotFound) {
				r.Gone = true
			} else {
				return fmt.Errorf("%s: %w", tag, err)
			}
			mu.Lock()
			out = append(out, *r)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	// A version sealed again (restored, re-pushed) is live, whatever its
	// tombstones say.
	var sealed []string
	for _, tag := range tags {
		if _, hex, ok := oci.ParseProtectiveTag(tag); ok && slices.ContainsFunc(out, func(r Deleted) bool { return r.Digest.Encoded()[:12] == hex }) {
			sealed = append(sealed, tag)
		}
	}
	res, err := versions.ResolveTags(ctx, t, sealed)
	if err != nil {
		return nil, err
	}
	for i := range out {
		for _, d := range res {
			if d.Digest == out[i].Digest {
				out[i].Live = true
			}
		}
	}
	slices.SortFunc(out, func(a, b Deleted) int {
		if c := a.Deleted.Compare(b.Deleted); c != 0 {
			return c
		}
		return strings.Compare(a.Tag, b.Tag)
	})
	return out, nil
}

// DeleteOptions configure SoftDelete.
type DeleteOptions struct {
	Now time.Time // the deletion time; zero: time.Now()
	// Check is called with the human tags pointing at the version now,
	// right before anything changes; an error stops the deletion.
	Check func(ctx context.Context, tags []string) error
}

// SoftDelete deletes the version d of t, restorably: it pushes a tombstone
// that keeps the version reachable, then points the version's human tags
// and protective tags at the tombstone, so the version leaves the version
// list. It works on registries that cannot delete tags, and deletes nothing.
// The error wraps ErrNotLive when d has no protective tag pointing at it.
func SoftDelete(ctx context.Context, t oci.Target, d digest.Digest, opt DeleteOptions) (*Deleted, error) {
	st, err := stateOf(ctx, t, d)
	if err != nil {
		return nil, err
	}
	if len(st.sealed) == 0 {
		return nil, fmt.Errorf("%s: %w (already deleted, or never sealed)", d, ErrNotLive)
	}
	if opt.Check != nil {
		if err := opt.Check(ctx, st.human); err != nil {
			return nil, err
		}
	}
	rdesc, err := t.Resolve(ctx, d.String())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d, err)
	}
	root, err := versions.Stat(ctx, t, rdesc)
	if err != nil {
		return nil, err
	}
	now := opt.Now
	if now.IsZero() {
		now = time.Now()
	}
	sealedAt, _, _ := oci.ParseProtectiveTag(st.sealed[0])
	for _, tag := range st.sealed[1:] {
		if ts, _, _ := oci.ParseProtectiveTag(tag); ts.Before(sealedAt) {
			sealedAt = ts
		}
	}
	b, err := tombstoneBytes(root.Desc, now, sealedAt, st.human)
	if err != nil {
		return nil, err
	}
	tag := DeletedTag(d, now)
	desc, err := oras.TagBytes(ctx, t, ocispec.MediaTypeImageIndex, b, tag)
	if err != nil {
		return nil, fmt.Errorf("%s: push tombstone %s: %w", d, tag, err)
	}
	for _, h := range append(slices.Clone(st.human), st.sealed...) {
		if err := oci.TagBytes(ctx, t, desc, b, h); err != nil {
			return nil, fmt.Errorf("%s: move %s to its tombstone: %w", d, h, err)
		}
	}
	return &Deleted{
		Digest: d, Deleted: now, Sealed: sealedAt, Tags: nonNil(st.human), Bytes: root.Bytes, Files: root.Files,
		Tag: tag, Tombstone: desc, Root: root.Desc,
	}, nil
}

// Restore brings the soft-deleted version d back: it gives it a new
// protective tag sealed now, without its old human tags, then deletes its
// tombstones (by digest, which also removes the tags pointing at them).
// It returns the protective tag; failing to delete a tombstone is reported
// in warn, since a tombstone of a live version is harmless.
func Restore(ctx context.Context, t oci.Target, d digest.Digest, now time.Time) (tag string, warn error, err error) {
	all, err := ListDeleted(ctx, t)
	if err != nil {
		return "", nil, err
	}
	var recs []Deleted
	for _, r := range all {
		if r.Digest == d {
			recs = append(recs, r)
		}
	}
	if len(recs) == 0 {
		return "", nil, fmt.Errorf("%s: %w", d, ErrNoTombstone)
	}
	root := recs[0].Root
	mb, err := fetchExact(ctx, t, root)
	if err != nil {
		return "", nil, fmt.Errorf("%s: the version is gone (purged?): %w", d, err)
	}
	if now.IsZero() {
		now = time.Now()
	}
	tag, err = oci.TagVersion(ctx, t, root, mb, nil, now)
	if err != nil {
		return "", nil, err
	}
	var warns []error
	for _, r := range recs {
		if err := deleteManifest(ctx, t, r.Tombstone); err != nil {
			warns = append(warns, fmt.Errorf("tombstone %s left in place: %w", r.Tag, err))
		}
	}
	return tag, errors.Join(warns...), nil
}

// fetchExact fetches the manifest desc and checks its size and digest.
func fetchExact(ctx context.Context, t oci.Target, desc ocispec.Descriptor) ([]byte, error) {
	if desc.Size <= 0 || desc.Size > layout.MaxManifestBytes {
		return nil, fmt.Errorf("%s: manifest of %d bytes", desc.Digest, desc.Size)
	}
	b, err := verify.Fetch(ctx, t, "", desc)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	return b, nil
}

// deleteManifest deletes a manifest by digest; one already gone is fine.
func deleteManifest(ctx context.Context, t oci.Target, desc ocispec.Descriptor) error {
	err := t.Delete(ctx, desc)
	if err == nil || errors.Is(err, errdef.ErrNotFound) {
		return nil
	}
	return fmt.Errorf("delete %s: %w", desc.Digest, err)
}
