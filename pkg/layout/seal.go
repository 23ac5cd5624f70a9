package layout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"strconv"
	"sync/atomic"

	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
)

// DefaultMaxLayers is the number of layers per manifest above which a
// version is sealed as an index of part manifests. 20,000 descriptors keep a
// manifest near 2.5 MB, well under the 4 MiB registries accept.
const DefaultMaxLayers = 20000

// Blob is a sealed piece of metadata: its descriptor and its bytes.
type Blob struct {
	Desc ocispec.Descriptor
	Data []byte
	// spill holds the bytes at off instead of Data, for a version whose
	// index pieces are not kept in memory (a push of many files).
	spill *os.File
	off   int64
}

// reader returns the blob's bytes.
func (b *Blob) reader() io.Reader {
	if b.spill != nil {
		return io.NewSectionReader(b.spill, b.off, b.Desc.Size)
	}
	return bytes.NewReader(b.Data)
}

// Sealed is a version ready to be stored: the index blobs, the empty
// config, the part manifests (if any), and the root, which must be pushed
// last.
type Sealed struct {
	Index  *Index
	Blobs  []Blob // index blobs (v1: the index; v2: top-level index, pieces), then the empty config
	Parts  []Blob // part manifests, empty for a single-manifest version
	Root   Blob   // root manifest or root image index
	Chunks []ocispec.Descriptor

	files int   // entries of the version
	bytes int64 // bytes of its regular files
	// pieces are the ends (exclusive entry numbers) of the index pieces
	// of a version 2 version, and their references.
	pieceEnds []int
	pieceRefs []PieceRef
	reused    int // pieces of pieceRefs taken from a piece memo
	// deltas are the delta chunks of a version 3 version, bases the base
	// chunk layers after its chunk layers.
	deltas []Delta
	bases  []ocispec.Descriptor
}

// Deltas returns the delta chunks of the sealed version, in chunk order.
func (s *Sealed) Deltas() []Delta { return s.deltas }

// Bases returns the base chunk layers that follow the chunk layers.
func (s *Sealed) Bases() []ocispec.Descriptor { return s.bases }

func blobOf(mediaType string, data []byte) Blob {
	return Blob{Desc: content.NewDescriptorFromBytes(mediaType, data), Data: data}
}

// Descriptor returns the descriptor of the chunk c, a layer of a version.
func (c Chunk) Descriptor() ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: MediaTypeChunk, Digest: c.Digest, Size: c.Size}
}

// Seal builds the manifests of a version from its index. The result is
// deterministic: the same index, maxLayers and annotations give the same
// root digest. Extra annotations (such as a sync's source revision) go on
// the root next to bdnvol's own, which they may not override.
func Seal(x *Index, maxLayers int, extra map[string]string) (*Sealed, error) {
	return SealSpill(x, maxLayers, extra, nil)
}

// Spill is an unlinked file that holds a version's encoded index
// pieces instead of memory; end is the bytes written to it.
type Spill struct {
	f   *os.File
	end int64
}

// blob returns the blob of an encoded piece, its bytes written to the
// spill file (held in memory when s is nil).
func (s *Spill) blob(data []byte) (Blob, error) {
	bl := blobOf(MediaTypePiece, data)
	if s == nil {
		return bl, nil
	}
	if _, err := s.f.WriteAt(data, s.end); err != nil {
		return Blob{}, fmt.Errorf("layout: keep index piece: %w", err)
	}
	bl.Data, bl.spill, bl.off = nil, s.f, s.end
	s.end += int64(len(data))
	return bl, nil
}

// NewSpill returns a spill writing to f, an unlinked file it owns.
func NewSpill(f *os.File) *Spill { return &Spill{f: f} }

// Close closes the spill's file; a nil spill is valid.
func (s *Spill) Close() {
	if s != nil {
		s.f.Close()
	}
}

// SealSpill is Seal; with spill, the index pieces are written there as
// they are encoded instead of kept in memory.
func SealSpill(x *Index, maxLayers int, extra map[string]string, spill *Spill) (*Sealed, error) {
	if maxLayers <= 0 {
		maxLayers = DefaultMaxLayers
	}
	if maxLayers < 2 {
		return nil, fmt.Errorf("layout: max layers must be at least 2")
	}
	s := &Sealed{Index: x}
	empty := emptyConfig()
	switch x.Version {
	case FormatVersion1:
		ib, err := x.Encode()
		if err != nil {
			return nil, err
		}
		s.Blobs = []Blob{blobOf(MediaTypeIndex, ib)}
	case FormatVersion:
		var pieces []Blob
		top, ends, refs, err := encodeV2Pieces(x, DefaultPieceParams, func(b []byte) error {
			bl, err := spill.blob(b)
			if err != nil {
				return err
			}
			pieces = append(pieces, bl)
			return nil
		})
		if err != nil {
			return nil, err
		}
		s.pieceEnds, s.pieceRefs = ends, refs
		s.Blobs = make([]Blob, 0, 1+len(pieces)+1)
		s.Blobs = append(s.Blobs, blobOf(MediaTypeIndexV2, top))
		s.Blobs = append(s.Blobs, pieces...)
	default:
		return nil, invalid("unsupported version %d", x.Version)
	}
	// The layers start with the index blobs; the empty config comes last.
	layers := make([]ocispec.Descriptor, 0, len(s.Blobs)+x.NumChunks())
	for _, b := range s.Blobs {
		layers = append(layers, b.Desc)
	}
	s.Blobs = append(s.Blobs, empty)
	s.Chunks = make([]ocispec.Descriptor, x.NumChunks())
	for i := range s.Chunks {
		s.Chunks[i] = x.ChunkDescriptor(i)
	}
	if err := s.seal(layers, empty.Desc, x.Len(), x.Bytes(), maxLayers, extra); err != nil {
		return nil, err
	}
	return s, nil
}

// emptyConfig is the config blob of every manifest of a version.
func emptyConfig() Blob {
	empty := Blob{Desc: ocispec.DescriptorEmptyJSON, Data: ocispec.DescriptorEmptyJSON.Data}
	empty.Desc.Data = nil
	return empty
}

// seal builds the root (and parts) of s from the index blobs' descriptors
// (layers) and s.Chunks.
func (s *Sealed) seal(layers []ocispec.Descriptor, config ocispec.Descriptor, files int, bytes int64, maxLayers int, extra map[string]string) error {
	s.files, s.bytes = files, bytes
	ann := make(map[string]string, len(extra)+3)
	maps.Copy(ann, extra)
	ann[AnnotationFiles] = strconv.Itoa(files)
	ann[AnnotationBytes] = strconv.FormatInt(bytes, 10)
	ann[AnnotationChunks] = strconv.Itoa(len(s.Chunks) - len(s.bases))
	layers = append(layers, s.Chunks...)
	if len(layers) <= maxLayers {
		m, err := manifest(ArtifactTypeVolume, config, layers, ann)
		if err != nil {
			return err
		}
		s.Root = m
		return nil
	}
	var parts []ocispec.Descriptor
	for start := 0; start < len(layers); start += maxLayers {
		end := min(start+maxLayers, len(layers))
		m, err := manifest(ArtifactTypePart, config, layers[start:end], nil)
		if err != nil {
			return err
		}
		s.Parts = append(s.Parts, m)
		d := m.Desc
		d.ArtifactType = ArtifactTypePart
		parts = append(parts, d)
	}
	root := ocispec.Index{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageIndex,
		ArtifactType: ArtifactTypeVolume,
		Manifests:    parts,
		Annotations:  ann,
	}
	b, err := json.Marshal(root)
	if err != nil {
		return err
	}
	s.Root = blobOf(ocispec.MediaTypeImageIndex, b)
	s.Root.Desc.ArtifactType = ArtifactTypeVolume
	return nil
}

func manifest(artifactType string, config ocispec.Descriptor, layers []ocispec.Descriptor, ann map[string]string) (Blob, error) {
	m := ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: artifactType,
		Config:       config,
		Layers:       layers,
		Annotations:  ann,
	}
	b, err := json.Marshal(m)
	if err != nil {
		return Blob{}, err
	}
	if len(b) > MaxManifestBytes {
		return Blob{}, fmt.Errorf("layout: manifest of %d bytes exceeds %d; lower the layers per manifest", len(b), MaxManifestBytes)
	}
	bl := blobOf(ocispec.MediaTypeImageManifest, b)
	bl.Desc.ArtifactType = artifactType
	return bl, nil
}

// MaxManifestBytes is the largest manifest registries accept.
const MaxManifestBytes = 4 << 20

// Store pushes the metadata of a sealed version: blobs, then parts, then the
// root. Chunks must already be stored. It returns the bytes it uploaded.
// The blobs of a group go storeJobs at a time: a version of a million files
// has thousands of index pieces, and one after another their round trips
// were most of its push's time.
func (s *Sealed) Store(ctx context.Context, dst content.Storage) (int64, error) {
	var up atomic.Int64
	for _, group := range [][]Blob{s.Blobs, s.Parts, {s.Root}} {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(storeJobs)
		for _, b := range group {
			g.Go(func() error {
				n, err := pushBytes(gctx, dst, b)
				up.Add(n)
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return up.Load(), err
		}
	}
	return up.Load(), nil
}

// storeJobs bounds the metadata blobs Store pushes at once.
const storeJobs = 8

// pushBytes stores b unless dst has it; it returns the bytes uploaded.
func pushBytes(ctx context.Context, dst content.Storage, b Blob) (int64, error) {
	ok, err := dst.Exists(ctx, b.Desc)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", b.Desc.Digest, err)
	}
	if ok {
		return 0, nil
	}
	if err := dst.Push(ctx, b.Desc, b.reader()); err != nil {
		if errors.Is(err, errdef.ErrAlreadyExists) {
			return 0, nil
		}
		return 0, fmt.Errorf("push %s %s: %w", b.Desc.MediaType, b.Desc.Digest, err)
	}
	return b.Desc.Size, nil
}
