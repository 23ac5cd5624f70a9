package versions

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// History record format; docs/history.md is the contract.
const (
	// HistoryTagPrefix starts the tag of every history record.
	HistoryTagPrefix = "history-"
	// ArtifactTypeHistory is the artifactType of a history record manifest.
	ArtifactTypeHistory = "application/vnd.bdnvol.history.v1"
	// AnnotationTag names, on a history record manifest, the tag it records.
	AnnotationTag = "io.bdnvol.history.tag"
	// AnnotationMoves holds, on a history record manifest, the JSON array of
	// the tag's moves, oldest first.
	AnnotationMoves = "io.bdnvol.history.moves"
	// AnnotationDropped counts, on a history record manifest, the oldest
	// moves dropped to keep the record small.
	AnnotationDropped = "io.bdnvol.history.dropped"
	// MaxMoves is the number of moves a record keeps; older ones are dropped
	// (and counted) so the manifest stays far under the 4 MiB registries take.
	MaxMoves = 5000
)

// Operations that move a tag.
const (
	OpPush = "push" // the tag was given to push
	OpTag  = "tag"  // bdnvol tag (including rollbacks)
	OpCopy = "copy" // bdnvol copy moved it (an import, a mirror)
)

// ErrInvalidHistory is wrapped when a history record is malformed.
var ErrInvalidHistory = errors.New("invalid history record")

// Move is one move of a tag: from Previous (empty when the tag was new) to
// Digest, at Time.
type Move struct {
	Time     time.Time     `json:"time"`
	Digest   digest.Digest `json:"digest"`
	Previous digest.Digest `json:"previous,omitempty"`
	Op       string        `json:"op"`
}

// History is the recorded moves of one tag, oldest first.
type History struct {
	Tag     string `json:"tag"`
	Moves   []Move `json:"moves"`
	Dropped int    `json:"dropped,omitempty"` // older moves no longer kept
}

// HistoryTag returns the tag of tag's history record: history-<tag>, or,
// when that would exceed the 128 characters a tag may have,
// history-<first 40 hex of SHA-256(tag)>.
func HistoryTag(tag string) string {
	if len(HistoryTagPrefix)+len(tag) <= 128 {
		return HistoryTagPrefix + tag
	}
	sum := sha256.Sum256([]byte(tag))
	return HistoryTagPrefix + hex.EncodeToString(sum[:])[:40]
}

// ReadHistory returns the recorded moves of tag; an empty History when
// nothing was recorded.
func ReadHistory(ctx context.Context, t oci.Target, tag string) (*History, error) {
	h := &History{Tag: tag, Moves: []Move{}}
	_, mb, err := oras.FetchBytes(ctx, t, HistoryTag(tag), oras.DefaultFetchBytesOptions)
	if errors.Is(err, errdef.ErrNotFound) {
		return h, nil
	}
	if err != nil {
		return nil, fmt.Errorf("history of %s: %w", tag, err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		return nil, fmt.Errorf("history of %s: %w: %v", tag, ErrInvalidHistory, err)
	}
	if m.ArtifactType != ArtifactTypeHistory {
		return nil, fmt.Errorf("history of %s: %w: artifactType %s", tag, ErrInvalidHistory, termsafe.Short(m.ArtifactType))
	}
	if got := m.Annotations[AnnotationTag]; got != tag {
		return nil, fmt.Errorf("history of %s: %w: records tag %s", tag, ErrInvalidHistory, termsafe.Short(got))
	}
	if err := json.Unmarshal([]byte(m.Annotations[AnnotationMoves]), &h.Moves); err != nil {
		return nil, fmt.Errorf("history of %s: %w: moves: %v", tag, ErrInvalidHistory, err)
	}
	if h.Moves == nil {
		h.Moves = []Move{}
	}
	if s := m.Annotations[AnnotationDropped]; s != "" {
		h.Dropped, _ = strconv.Atoi(s)
	}
	return h, nil
}

// Record appends moves of tag to its history record: it pushes, in one
// manifest PUT, a new record manifest holding the whole list and tagged
// with HistoryTag(tag). It uploads no blob (the record's config and layer
// are the empty JSON blob every version already has). Two concurrent
// Records of one tag may lose one of the moves.
func Record(ctx context.Context, t oci.Target, tag string, moves ...Move) error {
	if len(moves) == 0 {
		return nil
	}
	h, err := ReadHistory(ctx, t, tag)
	if err != nil && !errors.Is(err, ErrInvalidHistory) {
		return err
	}
	if err != nil { // start afresh rather than refuse every later move
		h = &History{Tag: tag}
	}
	mb, err := h.Append(moves...)
	if err != nil {
		return err
	}
	empty := ocispec.DescriptorEmptyJSON
	empty.Data = nil
	if err := pushIfMissing(ctx, t, empty, ocispec.DescriptorEmptyJSON.Data); err != nil {
		return fmt.Errorf("history of %s: %w", tag, err)
	}
	if _, err := oras.TagBytes(ctx, t, ocispec.MediaTypeImageManifest, mb, HistoryTag(tag)); err != nil {
		return fmt.Errorf("history of %s: %w", tag, err)
	}
	return nil
}

// Append appends moves (at least one) to h, dropping the oldest past
// MaxMoves, and returns the record manifest of h to tag HistoryTag(h.Tag).
// Its config and layer are the empty JSON blob (ocispec.DescriptorEmptyJSON).
func (h *History) Append(moves ...Move) ([]byte, error) {
	if len(moves) == 0 {
		return nil, errors.New("history: no move to record")
	}
	h.Moves = append(h.Moves, moves...)
	if n := len(h.Moves) - MaxMoves; n > 0 {
		h.Moves, h.Dropped = h.Moves[n:], h.Dropped+n
	}
	list, err := json.Marshal(h.Moves)
	if err != nil {
		return nil, err
	}
	empty := ocispec.DescriptorEmptyJSON
	empty.Data = nil
	ann := map[string]string{
		AnnotationTag:             h.Tag,
		AnnotationMoves:           string(list),
		ocispec.AnnotationCreated: moves[len(moves)-1].Time.UTC().Format(time.RFC3339Nano),
	}
	if h.Dropped > 0 {
		ann[AnnotationDropped] = strconv.Itoa(h.Dropped)
	}
	return json.Marshal(ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: ArtifactTypeHistory,
		Config:       empty,
		Layers:       []ocispec.Descriptor{empty},
		Annotations:  ann,
	})
}

func pushIfMissing(ctx context.Context, t oci.Target, desc ocispec.Descriptor, b []byte) error {
	ok, err := t.Exists(ctx, desc)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	if err := t.Push(ctx, desc, bytes.NewReader(b)); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
		return err
	}
	return nil
}

// TagOptions configure Tag.
type TagOptions struct {
	Now time.Time // time of the moves; zero means time.Now()
	Op  string    // recorded operation; empty means OpTag
}

// Tag points each of tags at the version root, in one manifest PUT each
// (skipping a tag already there), and records every move in the tag's
// history. It returns the moves it made by tag. Reserved tags are refused.
func Tag(ctx context.Context, t oci.Target, root *Root, tags []string, opt TagOptions) (map[string]Move, error) {
	for _, tag := range tags {
		if err := CheckTag(tag); err != nil {
			return nil, err
		}
	}
	prev := map[string]digest.Digest{}
	for _, tag := range tags {
		d, err := t.Resolve(ctx, tag)
		if err != nil && !errors.Is(err, errdef.ErrNotFound) {
			return nil, fmt.Errorf("resolve %s: %w", tag, err)
		}
		prev[tag] = d.Digest
	}
	moves := map[string]Move{}
	for _, tag := range tags {
		if _, done := moves[tag]; done || prev[tag] == root.Desc.Digest {
			continue
		}
		if err := oci.TagBytes(ctx, t, root.Desc, root.Manifest, tag); err != nil {
			return moves, err
		}
		m := Move{Time: opt.now(), Digest: root.Desc.Digest, Previous: prev[tag], Op: opt.op()}
		moves[tag] = m
		if err := Record(ctx, t, tag, m); err != nil {
			return moves, fmt.Errorf("%s now points at %s, but recording the move failed: %w", tag, root.Desc.Digest, err)
		}
	}
	return moves, nil
}

// RecordPush records, after a push, the moves of tags whose previous
// targets (resolved before the push; zero when new) were prev.
func RecordPush(ctx context.Context, t oci.Target, root digest.Digest, tags []string, prev map[string]digest.Digest, now time.Time) error {
	opt := TagOptions{Now: now, Op: OpPush}
	for _, tag := range tags {
		if prev[tag] == root {
			continue
		}
		if err := Record(ctx, t, tag, Move{Time: opt.now(), Digest: root, Previous: prev[tag], Op: opt.op()}); err != nil {
			return err
		}
	}
	return nil
}

func (o TagOptions) now() time.Time {
	if o.Now.IsZero() {
		return time.Now().UTC()
	}
	return o.Now.UTC()
}

func (o TagOptions) op() string {
	if o.Op == "" {
		return OpTag
	}
	return o.Op
}
