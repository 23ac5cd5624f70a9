package oci

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// SealedTagPrefix starts every protective tag.
const SealedTagPrefix = "sealed-"

// DeletedTagPrefix starts every tombstone tag of a soft-deleted version.
const DeletedTagPrefix = "deleted-"

// sealedTimeFormat is the UTC time inside a protective tag, to the
// millisecond so that versions sealed in one second still order; it sorts.
const sealedTimeFormat = "20060102T150405.000Z"

// ProtectiveTag returns the tag that keeps the version d alive: it names the
// sealing time and the first 12 hex digits of the digest, and sorts by time.
func ProtectiveTag(d digest.Digest, sealed time.Time) string {
	return TimedTag(SealedTagPrefix, d, sealed)
}

// ParseProtectiveTag returns the sealing time and digest prefix of a
// protective tag.
func ParseProtectiveTag(tag string) (time.Time, string, bool) {
	return ParseTimedTag(SealedTagPrefix, tag)
}

// TimedTag returns prefix, the time t (UTC, to the millisecond, so that tags
// sort by time) and the first 12 hex digits of d: the form of protective
// and tombstone tags.
func TimedTag(prefix string, d digest.Digest, t time.Time) string {
	return prefix + t.UTC().Format(sealedTimeFormat) + "-" + d.Encoded()[:12]
}

// ParseTimedTag returns the time and digest prefix of a tag that TimedTag
// made with prefix.
func ParseTimedTag(prefix, tag string) (time.Time, string, bool) {
	rest, ok := strings.CutPrefix(tag, prefix)
	if !ok {
		return time.Time{}, "", false
	}
	ts, hex, ok := strings.Cut(rest, "-")
	if !ok || len(hex) != 12 {
		return time.Time{}, "", false
	}
	t, err := time.Parse(sealedTimeFormat, ts)
	if err != nil {
		return time.Time{}, "", false
	}
	return t, hex, true
}

// ListTags returns every tag of the repository, following pagination
// within the bounds MaxTags, MaxTagBytes and MaxTagPages.
func ListTags(ctx context.Context, t Target) ([]string, error) {
	var out []string
	err := EachTag(ctx, t, func(tag string) error {
		out = append(out, tag)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// EachTag calls fn with each tag of the repository, in the order the
// registry lists them, following pagination within the bounds MaxTags,
// MaxTagBytes and MaxTagPages. fn returning StopListing ends the listing
// (nil is returned, no further page is asked for); another error ends it
// with that error. A repository that does not exist yet has no tags.
func EachTag(ctx context.Context, t Target, fn func(tag string) error) error {
	g := newListGuard("tag listing", maxTagPages)
	n, bytes, pages := 0, 0, 0
	err := t.Tags(g.with(ctx), "", func(tags []string) error {
		pages++
		if len(tags) > 0 {
			if err := g.page(pageHash(tags)); err != nil {
				return err
			}
		}
		for _, tag := range tags {
			n++
			bytes += len(tag)
			if n > maxTags {
				return fmt.Errorf("tag listing: %w: more than %d tags", ErrListTooLong, maxTags)
			}
			if bytes > maxTagBytes {
				return fmt.Errorf("tag listing: %w: tags of more than %d bytes together", ErrListTooLong, maxTagBytes)
			}
			if err := fn(tag); err != nil {
				return err
			}
		}
		return ctx.Err()
	})
	if errors.Is(err, StopListing) {
		return nil
	}
	var er *errcode.ErrorResponse
	if errors.As(err, &er) && er.StatusCode == http.StatusNotFound && pages == 0 {
		return nil // a repository without tags yet (not a page that vanished)
	}
	return err
}

// TagVersion gives the version root (with manifest bytes b) a protective
// tag unless it has one, then points each of tags at it. The protective tag
// comes first so the version is never left unreachable.
func TagVersion(ctx context.Context, t Target, root ocispec.Descriptor, b []byte, tags []string, now time.Time) (string, error) {
	prot := ""
	hex := root.Digest.Encoded()[:12]
	err := EachTag(ctx, t, func(tag string) error {
		if _, h, ok := ParseProtectiveTag(tag); ok && h == hex {
			if d, err := t.Resolve(ctx, tag); err == nil && d.Digest == root.Digest {
				prot = tag
				return StopListing
			}
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("list tags: %w", err)
	}
	if prot == "" {
		prot = ProtectiveTag(root.Digest, now)
		if err := TagBytes(ctx, t, root, b, prot); err != nil {
			return "", err
		}
	}
	for _, tag := range tags {
		if err := TagBytes(ctx, t, root, b, tag); err != nil {
			return prot, err
		}
	}
	return prot, nil
}

// NewestSealedTag returns the protective tag of the most recently sealed
// version, or "" when there is none.
func NewestSealedTag(ctx context.Context, t Target) string {
	newest := ""
	err := EachTag(ctx, t, func(tag string) error {
		if _, _, ok := ParseProtectiveTag(tag); ok && tag > newest {
			newest = tag
		}
		return nil
	})
	if err != nil {
		return ""
	}
	return newest
}
