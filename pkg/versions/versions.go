package versions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/origin"
)

// ErrReservedTag is wrapped when a human tag would use a prefix that bdnvol
// keeps for its own tags.
var ErrReservedTag = errors.New("reserved tag prefix")

// jobs bounds the concurrent registry requests of List and TagsOf.
const jobs = 8

// Root is what the root manifest (or root index) of a version tells without
// reading its file index.
type Root struct {
	Desc     ocispec.Descriptor
	Manifest []byte // the raw root manifest, for re-tagging in one PUT
	Files    int    // index entries, from the root's annotations
	Bytes    int64  // file bytes, from the root's annotations
	Chunks   int    // distinct chunks, from the root's annotations
}

// Version is one sealed version of a volume as List reports it.
type Version struct {
	Digest    digest.Digest `json:"digest"`
	Sealed    time.Time     `json:"sealed"`
	Bytes     int64         `json:"bytes"`
	Files     int           `json:"files"`
	Chunks    int           `json:"chunks"`
	Tags      []string      `json:"tags"`       // human tags pointing at it now, sorted
	SealedTag string        `json:"sealed_tag"` // its protective tag
}

// IsReserved reports whether tag is one bdnvol manages itself: a protective
// tag or a history record tag.
func IsReserved(tag string) bool {
	return strings.HasPrefix(tag, oci.SealedTagPrefix) || strings.HasPrefix(tag, HistoryTagPrefix) ||
		strings.HasPrefix(tag, oci.DeletedTagPrefix)
}

// CheckTag refuses a human tag that uses a reserved prefix.
func CheckTag(tag string) error {
	if IsReserved(tag) {
		return fmt.Errorf("tag %q: %w (%s, %s and %s are bdnvol's)", tag, ErrReservedTag, oci.SealedTagPrefix, HistoryTagPrefix, oci.DeletedTagPrefix)
	}
	return nil
}

// Stat fetches the root manifest desc names and checks that it is a bdnvol
// volume; the error wraps layout.ErrNotVolume otherwise.
func Stat(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (*Root, error) {
	if desc.Size <= 0 || desc.Size > layout.MaxManifestBytes {
		return nil, fmt.Errorf("%s: manifest of %d bytes: %w", desc.Digest, desc.Size, layout.ErrNotVolume)
	}
	b, err := verify.Fetch(ctx, src, "", desc)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	return parseRoot(desc, b)
}

func parseRoot(desc ocispec.Descriptor, b []byte) (*Root, error) {
	var m struct {
		MediaType    string            `json:"mediaType"`
		ArtifactType string            `json:"artifactType"`
		Annotations  map[string]string `json:"annotations"`
		Config       struct {
			MediaType string `json:"mediaType"`
		} `json:"config"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", desc.Digest, layout.ErrNotVolume, err)
	}
	if m.MediaType == "" {
		m.MediaType = desc.MediaType
	}
	if m.MediaType != ocispec.MediaTypeImageManifest && m.MediaType != ocispec.MediaTypeImageIndex {
		return nil, fmt.Errorf("%s: media type %s: %w", desc.Digest, termsafe.Short(m.MediaType), layout.ErrNotVolume)
	}
	if m.ArtifactType != layout.ArtifactTypeVolume && !(m.MediaType == ocispec.MediaTypeImageManifest && origin.IsForeign(m.ArtifactType, m.Config.MediaType)) {
		return nil, fmt.Errorf("%s: artifactType %s: %w", desc.Digest, termsafe.Short(m.ArtifactType), layout.ErrNotVolume)
	}
	r := &Root{Desc: desc, Manifest: b}
	r.Desc.MediaType = m.MediaType
	r.Files, _ = strconv.Atoi(m.Annotations[layout.AnnotationFiles])
	r.Bytes, _ = strconv.ParseInt(m.Annotations[layout.AnnotationBytes], 10, 64)
	r.Chunks, _ = strconv.Atoi(m.Annotations[layout.AnnotationChunks])
	return r, nil
}

// Resolve returns the version that ref names (a tag or a digest), checking
// that it exists and is a bdnvol volume.
func Resolve(ctx context.Context, t oci.Target, ref oci.Ref) (*Root, error) {
	desc, err := oci.Resolve(ctx, t, ref)
	if err != nil {
		return nil, err
	}
	r, err := Stat(ctx, t, desc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	return r, nil
}

// ErrUnreadableVersion is wrapped when a protective tag names a manifest
// that cannot be read: too large, broken, or not fetched.
var ErrUnreadableVersion = errors.New("unreadable version")

// Unreadable is a protective tag whose manifest List could not read.
type Unreadable struct {
	Tag string
	Err error
}

// Listing is what ListAll found: the versions it could read and the
// protective tags it could not.
type Listing struct {
	Versions   []Version
	Unreadable []Unreadable // by tag
}

// List returns every sealed version of the repository, found through the
// protective tags, newest first (versions sealed in the same second are in
// descending protective tag order). Each carries the human tags that point
// at it now. Protective tags that point at something other than a volume are
// ignored; one whose manifest cannot be read fails the listing with an error
// naming it (ListAll lists the rest).
func List(ctx context.Context, t oci.Target) ([]Version, error) {
	l, err := ListAll(ctx, t)
	if err != nil {
		return nil, err
	}
	if len(l.Unreadable) > 0 {
		return nil, l.Unreadable[0].Err
	}
	return l.Versions, nil
}

// ListAll is List that goes on past protective tags whose manifest cannot
// be read (larger than layout.MaxManifestBytes, not JSON, or failing to
// fetch) and reports them in Listing.Unreadable. Errors listing or
// resolving the human tags, and a cancelled ctx, still fail it.
func ListAll(ctx context.Context, t oci.Target) (*Listing, error) {
	tags, err := oci.ListTags(ctx, t)
	if err != nil {
		return nil, fmt.Errorf("list tags: %w", err)
	}
	var mu sync.Mutex
	byDigest := map[digest.Digest]*Version{}
	var bad []Unreadable
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(jobs)
	opts := oras.DefaultFetchBytesOptions
	opts.MaxBytes = layout.MaxManifestBytes
	for _, tag := range tags {
		sealed, _, ok := oci.ParseProtectiveTag(tag)
		if !ok {
			continue
		}
		g.Go(func() error {
			desc, b, err := oras.FetchBytes(gctx, t, tag, opts)
			if errors.Is(err, errdef.ErrNotFound) {
				return nil // deleted since the listing
			}
			if err == nil && !json.Valid(b) {
				err = fmt.Errorf("manifest %s is not JSON", desc.Digest)
			}
			if err != nil {
				if gctx.Err() != nil {
					return gctx.Err()
				}
				mu.Lock()
				bad = append(bad, Unreadable{Tag: tag, Err: fmt.Errorf("%s: %w: %w", tag, ErrUnreadableVersion, err)})
				mu.Unlock()
				return nil
			}
			r, err := parseRoot(desc, b)
			if err != nil {
				return nil // not a volume: not a version of this volume
			}
			mu.Lock()
			defer mu.Unlock()
			v := byDigest[desc.Digest]
			if v != nil && (v.Sealed.Before(sealed) || v.Sealed.Equal(sealed) && v.SealedTag < tag) {
				return nil // keep the first sealing
			}
			byDigest[desc.Digest] = &Version{
				Digest: desc.Digest, Sealed: sealed, Bytes: r.Bytes, Files: r.Files, Chunks: r.Chunks,
				Tags: []string{}, SealedTag: tag,
			}
			return nil
		})
	}
	var human map[digest.Digest][]string
	g.Go(func() error {
		var err error
		human, err = tagsOf(gctx, t, tags)
		return err
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out := make([]Version, 0, len(byDigest))
	for d, v := range byDigest {
		if h := human[d]; h != nil {
			v.Tags = h
		}
		out = append(out, *v)
	}
	slices.SortFunc(out, func(a, b Version) int {
		if c := b.Sealed.Compare(a.Sealed); c != 0 {
			return c
		}
		return strings.Compare(b.SealedTag, a.SealedTag)
	})
	slices.SortFunc(bad, func(a, b Unreadable) int { return strings.Compare(a.Tag, b.Tag) })
	return &Listing{Versions: out, Unreadable: bad}, nil
}

// ResolveTags resolves tags concurrently; a tag that names nothing is left
// out.
func ResolveTags(ctx context.Context, t oci.Target, tags []string) (map[string]ocispec.Descriptor, error) {
	var mu sync.Mutex
	out := map[string]ocispec.Descriptor{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(jobs)
	for _, tag := range tags {
		g.Go(func() error {
			d, err := t.Resolve(gctx, tag)
			if errors.Is(err, errdef.ErrNotFound) || errors.Is(err, oci.ErrInvalidLayout) { // gone, or a layout entry naming no readable manifest
				return nil
			}
			if err != nil {
				return fmt.Errorf("resolve %s: %w", tag, err)
			}
			mu.Lock()
			out[tag] = d
			mu.Unlock()
			return nil
		})
	}
	return out, g.Wait()
}

// TagsOf maps each digest to the human tags that point at it now, sorted.
func TagsOf(ctx context.Context, t oci.Target) (map[digest.Digest][]string, error) {
	tags, err := oci.ListTags(ctx, t)
	if err != nil {
		return nil, fmt.Errorf("list tags: %w", err)
	}
	return tagsOf(ctx, t, tags)
}

func tagsOf(ctx context.Context, t oci.Target, tags []string) (map[digest.Digest][]string, error) {
	human := make([]string, 0, len(tags))
	for _, tag := range tags {
		if !IsReserved(tag) {
			human = append(human, tag)
		}
	}
	res, err := ResolveTags(ctx, t, human)
	if err != nil {
		return nil, err
	}
	out := map[digest.Digest][]string{}
	for tag, d := range res {
		out[d.Digest] = append(out[d.Digest], tag)
	}
	for _, v := range out {
		slices.Sort(v)
	}
	return out, nil
}

// SealedTagOf returns the protective tag of the version d and its sealing
// time, or "" when it has none among tags.
func SealedTagOf(tags []string, d digest.Digest) (string, time.Time) {
	best, bestTime := "", time.Time{}
	for _, tag := range tags {
		ts, hex, ok := oci.ParseProtectiveTag(tag)
		if ok && hex == d.Encoded()[:12] && (best == "" || tag < best) {
			best, bestTime = tag, ts
		}
	}
	return best, bestTime
}
