package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"unicode/utf8"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/termsafe"
)

// Media types and annotations of the format.
const (
	// ArtifactTypeVolume is the artifactType of a sealed version's root.
	ArtifactTypeVolume = "application/vnd.bdnvol.volume.v1"
	// ArtifactTypePart is the artifactType of a part manifest under a root index.
	ArtifactTypePart = "application/vnd.bdnvol.volume.part.v1"
	// MediaTypeIndex is the media type of the file index blob of format
	// version 1.
	MediaTypeIndex = "application/vnd.bdnvol.index.v1+json"
	// MediaTypeIndexV2 is the media type of the top-level file index of
	// format version 2, which lists the index pieces.
	MediaTypeIndexV2 = "application/vnd.bdnvol.index.v2+json"
	// MediaTypePiece is the media type of a piece of a version 2 file index.
	MediaTypePiece = "application/vnd.bdnvol.index.piece.v2+json"
	// MediaTypeChunk is the media type of a chunk blob.
	MediaTypeChunk = "application/vnd.bdnvol.chunk.v1"

	// AnnotationFiles holds the number of index entries of a version.
	AnnotationFiles = "io.bdnvol.volume.files"
	// AnnotationBytes holds the total file bytes of a version.
	AnnotationBytes = "io.bdnvol.volume.bytes"
	// AnnotationChunks holds the number of distinct chunks of a version.
	AnnotationChunks = "io.bdnvol.volume.chunks"
)

// FormatVersion is the version of the file index this package writes.
const FormatVersion = 2

// FormatVersion1 is the first format: the whole index in one blob. It is
// still read, and written on request.
const FormatVersion1 = 1

// Limits that a parsed index must respect; they bound memory before any I/O.
const (
	MaxIndexBytes  = 1 << 30 // largest file index blob accepted
	MaxEntries     = 10_000_000
	MaxChunks      = 10_000_000
	MaxChunkBytes  = 256 << 20 // largest chunk accepted
	maxPathBytes   = 4096
	MaxTargetBytes = 4096 // longest symbolic link target accepted
)

// Entry types.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
)

// ErrUnsupportedFile is wrapped when a tree holds a file type the format
// cannot store (device, socket, FIFO) or a symlink leaving the root.
var ErrUnsupportedFile = errors.New("layout: unsupported file")

// ErrInvalidIndex is wrapped by every error about a malformed or unsafe index.
var ErrInvalidIndex = errors.New("layout: invalid file index")

// Index is the file index of a sealed version.
type Index struct {
	Version  int    `json:"version"`
	Chunking Params `json:"chunking"`
	// Chunks are the chunks of an index built in memory (by a push). An
	// opened index holds them in a compact form instead and Chunks is nil:
	// read them with NumChunks, Chunk, ChunkSize, ChunkDigest and
	// ChunkDescriptor, which work on both.
	Chunks []Chunk `json:"chunks"`
	// Files are the entries of an index built in memory (by a push). An
	// opened index holds them in a compact form instead and Files is nil:
	// read entries with Len, File, Path and Find, which work on both. Set
	// Files (to AllFiles, changed) to replace an opened index's entries.
	Files []File `json:"files"`

	ent    *entries    // the compact entries, when not nil
	ch     *chunkTable // the compact chunks, when not nil
	pieces []PieceRef  // of an opened version 2 index

	// The delta chunks of a version 3 index, in chunk order, by chunk
	// number and by digest; plain holds the digests of its other chunks.
	deltas  []Delta
	deltaAt map[int]int
	deltaOf map[digest.Digest]int
	plain   map[digest.Digest]bool
}

// Chunk names one chunk blob of a version.
type Chunk struct {
	Digest digest.Digest `json:"digest"`
	Size   int64         `json:"size"`
	// Head and Tail are the SHA-256 of the first and the last EdgeBytes of
	// the chunk, given for chunks of at least EdgeMinChunk bytes: a reader
	// that needs only an edge (a page shared with the neighbouring tensor)
	// can fetch and verify just that range.
	Head digest.Digest `json:"head,omitempty"`
	Tail digest.Digest `json:"tail,omitempty"`
}

// EdgeBytes is the length of a chunk's head and tail edges.
const EdgeBytes = 256 << 10

// EdgeMinChunk is the size from which chunks carry edge digests.
const EdgeMinChunk = 4 * EdgeBytes

// HasEdges reports whether the chunk carries edge digests.
func (c Chunk) HasEdges() bool { return c.Head != "" }

// File is one entry of the index: a regular file, a directory or a symlink.
type File struct {
	Path    string        `json:"path"`
	Type    string        `json:"type"`
	Mode    uint32        `json:"mode"`
	Size    int64         `json:"size,omitempty"`
	Digest  digest.Digest `json:"digest,omitempty"`
	Target  string        `json:"target,omitempty"`
	Extents []Extent      `json:"extents,omitempty"`
}

// Extent is a run of a file's bytes stored in a chunk.
type Extent struct {
	Chunk  int
	Offset int64
	Length int64
}

// MarshalJSON encodes an extent as a compact [chunk, offset, length] array.
func (e Extent) MarshalJSON() ([]byte, error) {
	return []byte(fmt.Sprintf("[%d,%d,%d]", e.Chunk, e.Offset, e.Length)), nil
}

// UnmarshalJSON decodes a [chunk, offset, length] array.
func (e *Extent) UnmarshalJSON(b []byte) error {
	var a []int64
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	if len(a) != 3 {
		return fmt.Errorf("extent must have 3 numbers, has %d", len(a))
	}
	if a[0] < 0 || a[0] > MaxChunks {
		return fmt.Errorf("extent chunk %d out of range", a[0])
	}
	e.Chunk, e.Offset, e.Length = int(a[0]), a[1], a[2]
	return nil
}

// Bytes returns the total size of the regular files of the index.
func (x *Index) Bytes() int64 {
	var n int64
	if x.ent != nil && x.Files == nil {
		for _, e := range x.ent.ext {
			n += int64(e.length)
		}
		return n
	}
	for i := range x.Files {
		n += x.Files[i].Size
	}
	return n
}

// InheritedParams returns the chunking parameters a later push of the
// volume takes over: Params.Inherited, plus a pack size of small files when
// the index is of version 1 (whose small files are packed anew once).
func (x *Index) InheritedParams() Params {
	p := x.Chunking.Inherited()
	if x.Version == FormatVersion1 && p.Pack == 0 {
		p.Pack = min(DefaultPack, p.Avg)
	}
	return p
}

// Encode returns the canonical JSON encoding of the index.
func (x *Index) Encode() ([]byte, error) {
	if err := x.Validate(); err != nil {
		return nil, err
	}
	return x.encode()
}

func (x *Index) encode() ([]byte, error) {
	if (x.ent != nil && x.Files == nil) || (x.ch != nil && x.Chunks == nil) {
		y := *x
		y.Files, y.ent = x.AllFiles(), nil
		y.Chunks, y.ch = x.AllChunks(), nil
		return y.encode()
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(x); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// DecodeIndex parses and validates a file index blob of format version 1.
func DecodeIndex(b []byte) (*Index, error) {
	if len(b) > MaxIndexBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds the limit", ErrInvalidIndex, len(b))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var x Index
	if err := dec.Decode(&x); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidIndex, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data", ErrInvalidIndex)
	}
	if x.Version != FormatVersion1 {
		return nil, invalid("a one-blob index of version %d", x.Version)
	}
	if err := x.Validate(); err != nil {
		return nil, err
	}
	// One index has one encoding: keys in another case, a key given twice,
	// whitespace, escapes or number forms another reader could read
	// differently are refused.
	canon, err := x.encode()
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(canon, b) {
		at := 0
		for at < len(b) && at < len(canon) && b[at] == canon[at] {
			at++
		}
		return nil, fmt.Errorf("%w: not in the canonical encoding (differs at byte %d)", ErrInvalidIndex, at)
	}
	return &x, nil
}

// invalid wraps ErrInvalidIndex; string arguments print shortened under %q.
// Invalid returns an error wrapping ErrInvalidIndex, its arguments made
// safe to print.
func Invalid(format string, args ...any) error {
	return invalid(format, args...)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidIndex, fmt.Sprintf(format, termsafe.ShortArgs(args...)...))
}

// refuse is fmt.Errorf with string arguments shortened under %q: a refused
// path or symlink target may be kilobytes long.
func refuse(format string, args ...any) error {
	return fmt.Errorf(format, termsafe.ShortArgs(args...)...)
}

// Validate checks that the index is safe to materialise: paths are
// relative, clean and unique, every parent is a directory of the index, no
// symlink leaves the root, and every extent lies inside its chunk.
func (x *Index) Validate() error {
	if x.Version != FormatVersion && x.Version != FormatVersion1 {
		return invalid("unsupported version %d", x.Version)
	}
	if x.Version == FormatVersion1 && x.Chunking.Pack != 0 {
		return invalid("a pack size in a version 1 index")
	}
	if x.Len() > MaxEntries {
		return invalid("%d entries exceed the limit of %d", x.Len(), MaxEntries)
	}
	if x.NumChunks() > MaxChunks {
		return invalid("%d chunks exceed the limit of %d", x.NumChunks(), MaxChunks)
	}
	chunks := x.AllChunks()
	if err := CheckChunks(chunks); err != nil {
		return err
	}
	dirs := make(map[string]struct{})
	isDir := func(p string) bool { _, ok := dirs[p]; return ok }
	prev := ""
	for i := range x.Len() {
		f := x.File(i)
		if err := checkEntry(i, &f, prev, chunks, isDir); err != nil {
			return err
		}
		if f.Type == TypeDir {
			dirs[f.Path] = struct{}{}
		}
		prev = f.Path
	}
	return nil
}

// CheckChunks checks a chunk table: digests, sizes, edges, no duplicates.
func CheckChunks(chunks []Chunk) error {
	seen := make(map[digest.Digest]struct{}, len(chunks))
	for i, c := range chunks {
		if err := checkChunk(i, c); err != nil {
			return err
		}
		if _, dup := seen[c.Digest]; dup {
			return invalid("chunk %s listed twice", c.Digest)
		}
		seen[c.Digest] = struct{}{}
	}
	return nil
}

func checkChunk(i int, c Chunk) error {
	if !IsSHA256(c.Digest) {
		return invalid("chunk %d: bad digest %q", i, c.Digest)
	}
	if c.Size <= 0 || c.Size > MaxChunkBytes {
		return invalid("chunk %d (%s): bad size %d", i, c.Digest, c.Size)
	}
	if c.Head != "" || c.Tail != "" {
		if c.Size < EdgeMinChunk {
			return invalid("chunk %s: edge digests on a chunk of %d bytes", c.Digest, c.Size)
		}
		for _, d := range []digest.Digest{c.Head, c.Tail} {
			if !IsSHA256(d) {
				return invalid("chunk %s: bad edge digest %q", c.Digest, d)
			}
		}
	}
	return nil
}

// checkEntry checks entry i of an index whose previous entry is prev
// ("" for the first), whose extents name chunks, and whose directories so
// far are those isDir reports.
func checkEntry(i int, f *File, prev string, chunks []Chunk, isDir func(string) bool) error {
	if err := CheckPath(f.Path); err != nil {
		return invalid("entry %d: %v", i, err)
	}
	if i > 0 && f.Path <= prev {
		if f.Path == prev {
			return invalid("duplicate path %q", f.Path)
		}
		return invalid("paths not sorted: %q after %q", f.Path, prev)
	}
	if parent := parentOf(f.Path); parent != "" {
		if !isDir(parent) {
			return invalid("%q: parent %q is not a directory of the volume", f.Path, parent)
		}
	}
	if f.Mode&^0o777 != 0 {
		return invalid("%q: mode %o has bits beyond 0777", f.Path, f.Mode)
	}
	switch f.Type {
	case TypeDir:
		if f.Size != 0 || f.Digest != "" || f.Target != "" || len(f.Extents) != 0 {
			return invalid("%q: directory with content", f.Path)
		}
	case TypeSymlink:
		if f.Size != 0 || f.Digest != "" || len(f.Extents) != 0 {
			return invalid("%q: symlink with content", f.Path)
		}
		if err := CheckSymlink(f.Path, f.Target); err != nil {
			return invalid("%v", err)
		}
	case TypeFile:
		if f.Target != "" {
			return invalid("%q: file with a symlink target", f.Path)
		}
		if !IsSHA256(f.Digest) {
			return invalid("%q: bad digest %q", f.Path, f.Digest)
		}
		if f.Size < 0 {
			return invalid("%q: negative size", f.Path)
		}
		var sum int64
		for _, e := range f.Extents {
			if e.Chunk < 0 || e.Chunk >= len(chunks) {
				return invalid("%q: extent names chunk %d of %d", f.Path, e.Chunk, len(chunks))
			}
			c := chunks[e.Chunk]
			if e.Length <= 0 || e.Offset < 0 || e.Offset > c.Size || e.Length > c.Size-e.Offset {
				return invalid("%q: extent [%d,%d,%d] outside chunk %s of %d bytes", f.Path, e.Chunk, e.Offset, e.Length, c.Digest, c.Size)
			}
			sum += e.Length
			if sum > f.Size {
				break
			}
		}
		if sum != f.Size {
			return invalid("%q: extents cover %d bytes, size is %d", f.Path, sum, f.Size)
		}
	default:
		return invalid("%q: unknown type %q", f.Path, f.Type)
	}
	return nil
}

// parentOf returns the parent directory of a slash path, or "" at the root.
func parentOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return ""
}

// CheckPath checks an index path: relative, clean, slash-separated, not
// reserved, of bounded length.
func CheckPath(p string) error {
	if len(p) > maxPathBytes {
		return fmt.Errorf("path of %d bytes is too long", len(p))
	}
	if strings.IndexByte(p, 0) >= 0 {
		return refuse("path %q contains NUL", p)
	}
	if p == "." || !fs.ValidPath(p) {
		return refuse("unsafe path %q", p)
	}
	if !utf8.ValidString(p) {
		return refuse("path %q is not UTF-8", p)
	}
	if Reserved(p) {
		return refuse("path %q: names starting with %q are bdnvol's own", p, ReservedPrefix)
	}
	return nil
}

// Reserved reports whether an element of the slash path p starts with
// ReservedPrefix: a name bdnvol keeps for its own files.
func Reserved(p string) bool {
	for {
		if strings.HasPrefix(p, ReservedPrefix) {
			return true
		}
		i := strings.IndexByte(p, '/')
		if i < 0 {
			return false
		}
		p = p[i+1:]
	}
}

// CheckSymlink returns an error when a symlink at path p with the given
// target would resolve outside the volume root.
func CheckSymlink(p, target string) error {
	if target == "" || len(target) > MaxTargetBytes || strings.IndexByte(target, 0) >= 0 || !utf8.ValidString(target) {
		return refuse("symlink %q: bad target %q", p, target)
	}
	if strings.HasPrefix(target, "/") {
		return refuse("symlink %q: absolute target %q leaves the volume", p, target)
	}
	// The target may climb with leading ".." elements (through real
	// directories only: every parent is a directory of the volume) and then
	// descend. A ".." after a named element could climb out through another
	// symlink, so it is refused.
	depth := strings.Count(p, "/") // directories between the root and the link
	descended := false
	for _, el := range strings.Split(target, "/") {
		switch el {
		case "", ".":
		case "..":
			if descended {
				return refuse("symlink %q: target %q has \"..\" after a name", p, target)
			}
			depth--
			if depth < 0 {
				return refuse("symlink %q: target %q leaves the volume", p, target)
			}
		default:
			descended = true
		}
	}
	return nil
}

// ReservedPrefix starts every name bdnvol keeps for itself in a directory it
// writes (temporary files, state). No entry of a volume may have a path
// element with this prefix, so nothing of a volume can collide with them.
const ReservedPrefix = ".bdnvol-"
