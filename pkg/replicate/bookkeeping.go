package replicate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/retention"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// TagMove is a human tag a copy moved at the destination from the version
// it pointed at there.
type TagMove struct {
	Tag  string        `json:"tag"`
	From digest.Digest `json:"from"`
	To   digest.Digest `json:"to"`
}

// KeptTag is a tag of the source a copy left as the destination has it.
type KeptTag struct {
	Tag    string `json:"tag"`
	Reason string `json:"reason"`
}

// ErrForeignBookkeeping is wrapped when a source's protective or tombstone
// tag names a version other than the one the copy carries under it.
var ErrForeignBookkeeping = errors.New("bookkeeping tag for a version the copy does not carry")

// destTags lists the destination's tags once.
func (c *copier) destTags(ctx context.Context) (map[string]bool, error) {
	if c.dstTagSet != nil {
		return c.dstTagSet, nil
	}
	tags, err := oci.ListTags(ctx, c.dst.Target)
	if err != nil {
		return nil, fmt.Errorf("%s: list tags: %w", c.dst.Ref.Repo(), err)
	}
	c.dstTagSet = make(map[string]bool, len(tags))
	for _, t := range tags {
		c.dstTagSet[t] = true
	}
	return c.dstTagSet, nil
}

// destDesc returns what tag points at in the destination (zero when it
// has no such tag).
func (c *copier) destDesc(ctx context.Context, tag string) (ocispec.Descriptor, error) {
	have, err := c.destTags(ctx)
	if err != nil || !have[tag] {
		return ocispec.Descriptor{}, err
	}
	d, err := c.dst.Target.Resolve(ctx, tag)
	if errors.Is(err, errdef.ErrNotFound) {
		return ocispec.Descriptor{}, nil
	}
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("%s: resolve %s: %w", c.dst.Ref.Repo(), tag, err)
	}
	return d, nil
}

// signatureSubject returns the digest a signature or referrers tag
// (sha256-<hex>, sha256-<hex>.sig, .att, .sbom) is about.
func signatureSubject(tag string) (digest.Digest, bool) {
	rest, ok := strings.CutPrefix(tag, "sha256-")
	if !ok || len(rest) < 64 {
		return "", false
	}
	d := digest.NewDigestFromEncoded(digest.SHA256, rest[:64])
	if d.Validate() != nil || len(rest) > 64 && rest[64] != '.' {
		return "", false
	}
	return d, true
}

// settleTags applies what a copy may change of the destination's
// bookkeeping to the tags it is to move (c.tags), before anything is sent:
//   - a protective tag must name the version it points at, a tombstone tag
//     the version its tombstone holds, which the destination must not keep
//     alive under a protective tag of its own; else the copy fails;
//   - a signature tag (sha256-<hex>.sig, .att, .sbom, and the referrers tag
//     sha256-<hex>) moves only if its subject is in the copy and it keeps
//     every signature the destination's holds; else the destination's is
//     kept (reported in Kept);
//   - a history record the destination has is kept: the moves the copy
//     makes of a human tag are appended to it (op "copy"); a source's record
//     goes only where the destination has none, with the copy's move
//     appended if the tag pointed elsewhere there;
//   - every human tag moved from a version the destination had is reported
//     in Moved.
func (c *copier) settleTags(ctx context.Context, srcHistory map[string]bool) error {
	now := c.opt.Now
	if now.IsZero() {
		now = time.Now()
	}
	var out []tagging
	carriedHistory := map[string]tagging{}
	type humanMove struct {
		tag      string
		from, to digest.Digest
	}
	var humans []humanMove
	for _, t := range c.tags {
		if err := ctx.Err(); err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(t.tag, versions.HistoryTagPrefix):
			have, err := c.destTags(ctx)
			if err != nil {
				return err
			}
			if have[t.tag] {
				c.keep(t.tag, "the destination's history is kept")
				continue
			}
			carriedHistory[t.tag] = t
			continue
		case strings.HasPrefix(t.tag, oci.SealedTagPrefix):
			if _, hex, ok := oci.ParseProtectiveTag(t.tag); !ok || !strings.HasPrefix(t.desc.Digest.Encoded(), hex) {
				return fmt.Errorf("%s: tag %s points at %s: %w", c.src.Ref.Repo(), t.tag, t.desc.Digest, ErrForeignBookkeeping)
			}
		case strings.HasPrefix(t.tag, oci.DeletedTagPrefix):
			if err := c.checkTombstone(ctx, t); err != nil {
				return err
			}
		default:
			if subject, ok := signatureSubject(t.tag); ok {
				keep, err := c.keepSignature(ctx, t, subject)
				if err != nil {
					return err
				}
				if keep != "" {
					c.keep(t.tag, keep)
					continue
				}
				break
			}
			old, err := c.destDesc(ctx, t.tag)
			if err != nil {
				return err
			}
			if old.Digest != t.desc.Digest {
				humans = append(humans, humanMove{tag: t.tag, from: old.Digest, to: t.desc.Digest})
				if old.Digest != "" {
					c.report.Moved = append(c.report.Moved, TagMove{Tag: t.tag, From: old.Digest, To: t.desc.Digest})
				}
			}
		}
		out = append(out, t)
	}
	c.tags = out
	// History: after the tags it records.
	for _, m := range humans {
		ht := versions.HistoryTag(m.tag)
		have, err := c.destTags(ctx)
		if err != nil {
			return err
		}
		var h *versions.History
		switch {
		case have[ht]:
			if h, err = versions.ReadHistory(ctx, c.dst.Target, m.tag); errors.Is(err, versions.ErrInvalidHistory) {
				h, err = &versions.History{Tag: m.tag}, nil // as versions.Record: start afresh
			}
		case srcHistory[ht]:
			if h, err = versions.ReadHistory(ctx, c.src.Target, m.tag); errors.Is(err, versions.ErrInvalidHistory) {
				h, err = nil, nil // the source's record is left out
				delete(carriedHistory, ht)
			}
		}
		if err != nil {
			return err
		}
		if h == nil {
			continue // no record to append to: none is started
		}
		if n := len(h.Moves); n > 0 && h.Moves[n-1].Digest == m.to && !have[ht] {
			continue // the source's record already ends with this move
		}
		b, err := h.Append(versions.Move{Time: now.UTC(), Digest: m.to, Previous: m.from, Op: versions.OpCopy})
		if err != nil {
			return err
		}
		if err := c.addHistory(ctx, ht, b); err != nil {
			return err
		}
		delete(carriedHistory, ht)
	}
	for _, ht := range slices.Sorted(maps.Keys(carriedHistory)) {
		c.tags = append(c.tags, carriedHistory[ht])
	}
	return nil
}

// keep reports a tag of the source left as the destination has it.
func (c *copier) keep(tag, reason string) {
	c.report.Kept = append(c.report.Kept, KeptTag{Tag: tag, Reason: reason})
}

// checkTombstone accepts the tombstone tag t only if it names the version
// its tombstone holds, and the destination keeps that version under no
// protective tag of its own.
func (c *copier) checkTombstone(ctx context.Context, t tagging) error {
	bad := func(why string) error {
		return fmt.Errorf("%s: tag %s %s: %w", c.src.Ref.Repo(), t.tag, why, ErrForeignBookkeeping)
	}
	_, hex, ok := retention.ParseDeletedTag(t.tag)
	i, carried := c.byDigest[t.desc.Digest]
	if !ok || !carried {
		return bad("is not a tombstone tag of a carried tombstone")
	}
	b, err := c.manifestBytes(ctx, c.manifests[i])
	if err != nil {
		return err
	}
	var idx ocispec.Index
	if json.Unmarshal(b, &idx) != nil || idx.ArtifactType != retention.ArtifactTypeTombstone || len(idx.Manifests) != 1 {
		return bad(fmt.Sprintf("points at %s, not a tombstone", t.desc.Digest))
	}
	v := idx.Manifests[0].Digest
	if !strings.HasPrefix(v.Encoded(), hex) || idx.Annotations[retention.AnnotationVersion] != v.String() {
		return bad(fmt.Sprintf("points at the tombstone of %s", v))
	}
	have, err := c.destTags(ctx)
	if err != nil {
		return err
	}
	for tag := range have {
		if _, h, ok := oci.ParseProtectiveTag(tag); ok && h == hex {
			if d, err := c.dst.Target.Resolve(ctx, tag); err == nil && d.Digest == v {
				return bad(fmt.Sprintf("would delete %s, which the destination keeps (%s)", v, tag))
			}
		}
	}
	return nil
}

// keepSignature returns why the signature tag t (about subject) is left
// as the destination has it, or "" to move it: its subject must be in the
// copy, and a signature manifest the destination has under the tag must
// have all its signatures (layers, or manifests of a referrers index) in
// the source's.
func (c *copier) keepSignature(ctx context.Context, t tagging, subject digest.Digest) (string, error) {
	if _, ok := c.byDigest[subject]; !ok {
		return "its subject " + subject.String() + " is not in the copy", nil
	}
	old, err := c.destDesc(ctx, t.tag)
	if err != nil || old.Digest == "" || old.Digest == t.desc.Digest {
		return "", err
	}
	i, ok := c.byDigest[t.desc.Digest]
	if !ok {
		return "the source's signature manifest is not in the copy", nil
	}
	nb, err := c.manifestBytes(ctx, c.manifests[i])
	if err != nil {
		return "", err
	}
	if old.Size <= 0 || old.Size > oci.MaxManifestBytes {
		return "the destination's signature manifest is not one", nil
	}
	ob, err := verify.Fetch(ctx, c.dst.Target, "", old)
	if err != nil {
		return "", fmt.Errorf("%s: %s: %w", c.dst.Ref.Repo(), t.tag, err)
	}
	var n, o node
	if json.Unmarshal(nb, &n) != nil || json.Unmarshal(ob, &o) != nil {
		return "the signature manifests do not parse", nil
	}
	has := map[digest.Digest]bool{}
	for _, d := range append(n.Layers, n.Manifests...) {
		has[d.Digest] = true
	}
	for _, d := range append(o.Layers, o.Manifests...) {
		if !has[d.Digest] {
			return "the destination's holds signature " + d.Digest.String() + ", which the source's lacks", nil
		}
	}
	return "", nil
}

// addHistory adds the history record b, tagged tag, to the copy.
func (c *copier) addHistory(ctx context.Context, tag string, b []byte) error {
	empty := ocispec.DescriptorEmptyJSON
	empty.Data = nil
	if !c.seen[empty.Digest] {
		c.seen[empty.Digest] = true
		c.blobs = append(c.blobs, empty)
		c.madeEmpty = true // sent from its known bytes
	}
	d := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(b), Size: int64(len(b)), ArtifactType: versions.ArtifactTypeHistory}
	if _, ok := c.byDigest[d.Digest]; !ok {
		c.seen[d.Digest] = true
		c.byDigest[d.Digest] = len(c.manifests)
		c.manifests = append(c.manifests, manifest{desc: d, b: b, at: versions.ArtifactTypeHistory})
	}
	c.tag(d, tag)
	return nil
}
