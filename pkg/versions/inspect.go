package versions

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/origin"
)

// FileInfo is one index entry as Inspect reports it.
type FileInfo struct {
	Path   string        `json:"path"`
	Type   string        `json:"type"`
	Size   int64         `json:"size"`
	Mode   uint32        `json:"mode"`
	SHA256 string        `json:"sha256,omitempty"`
	Target string        `json:"target,omitempty"`
	digest digest.Digest // unexported: the index digest, for Diff
}

// Details describe one version in full.
type Details struct {
	Digest        digest.Digest `json:"digest"`
	FormatVersion int           `json:"format_version"`
	Sealed        *time.Time    `json:"sealed,omitempty"`
	SealedTag     string        `json:"sealed_tag,omitempty"`
	Tags          []string      `json:"tags"`
	Files         FileList      `json:"files"`
	Bytes         int64         `json:"bytes"`        // file bytes
	Chunks        int           `json:"chunks"`       // distinct chunks
	UniqueBytes   int64         `json:"unique_bytes"` // bytes of the distinct chunks
	// Foreign is the artifactType of a foreign artifact read as a version
	// (a ModelPack model), "" for a bdnvol volume.
	Foreign string `json:"foreign,omitempty"`
	// Streamed are the files of a foreign artifact that cannot be read by
	// range (in compressed layers): a read streams their layer whole.
	Streamed []string `json:"streamed,omitempty"`
	// Deltas are the chunks stored as deltas (format version 3), each with
	// its delta blob and its base chunk; DeltaBytes the delta blobs' bytes.
	Deltas     []layout.Delta `json:"deltas,omitempty"`
	DeltaBytes int64          `json:"delta_bytes,omitempty"`
}

// Inspect opens and verifies the version desc of t and describes it,
// with the tags that point at it now.
func Inspect(ctx context.Context, t oci.Target, desc ocispec.Descriptor) (*Details, error) {
	v, err := origin.OpenWith(ctx, t, desc, layout.OpenOptions{SkipEdges: true}) // whole chunks at most
	if err != nil {
		return nil, err
	}
	d := &Details{
		Digest:        desc.Digest,
		FormatVersion: v.Index.Version,
		Files:         FileList{x: v.Index},
		Bytes:         v.Index.Bytes(),
	}
	d.Chunks, d.UniqueBytes = uniqueChunks(v.Index)
	if d.Deltas = v.Index.Deltas(); len(d.Deltas) > 0 {
		d.FormatVersion = v.Index.FormatVersion()
		for _, x := range d.Deltas {
			d.DeltaBytes += x.DeltaSize
		}
	}
	d.Foreign = v.Foreign
	for p := range v.Streamed {
		d.Streamed = append(d.Streamed, p)
	}
	sort.Strings(d.Streamed)
	tags, err := oci.ListTags(ctx, t)
	if err != nil {
		return nil, fmt.Errorf("list tags: %w", err)
	}
	if st, ts := SealedTagOf(tags, desc.Digest); st != "" {
		d.SealedTag, d.Sealed = st, &ts
	}
	human, err := tagsOf(ctx, t, tags)
	if err != nil {
		return nil, err
	}
	d.Tags = human[desc.Digest]
	if d.Tags == nil {
		d.Tags = []string{}
	}
	return d, nil
}

// FileList is the entries of an inspected version, read from its index on
// demand: a version of a million files is not held as a million FileInfos.
type FileList struct {
	x *layout.Index
	// placeholder makes MarshalJSON write filesPlaceholder, for WriteJSON.
	placeholder bool
}

// Len returns the number of entries.
func (l FileList) Len() int {
	if l.x == nil {
		return 0
	}
	return l.x.Len()
}

// At returns entry i.
func (l FileList) At(i int) FileInfo { return fileInfo(l.x.File(i)) }

// All yields the entries in path order.
func (l FileList) All() iter.Seq[FileInfo] {
	return func(yield func(FileInfo) bool) {
		for i := range l.Len() {
			if !yield(l.At(i)) {
				return
			}
		}
	}
}

// MarshalJSON encodes the entries as a JSON array.
func (l FileList) MarshalJSON() ([]byte, error) {
	if l.placeholder {
		return []byte(filesPlaceholder), nil
	}
	var buf bytes.Buffer
	if err := l.writeJSON(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (l FileList) writeJSON(w io.Writer) error {
	bw := bufio.NewWriter(w)
	bw.WriteByte('[')
	for i := range l.Len() {
		if i > 0 {
			bw.WriteByte(',')
		}
		b, err := json.Marshal(l.At(i))
		if err != nil {
			return err
		}
		bw.Write(b)
	}
	bw.WriteByte(']')
	return bw.Flush()
}

// filesPlaceholder stands for the file list in WriteJSON's first pass; no
// path or name of a version can contain NUL.
const filesPlaceholder = `"\u0000bdnvol-files"`

// WriteJSON writes v, a value holding d, as json.Encoder.Encode would, but
// streams d's file list instead of building it in memory.
func WriteJSON(w io.Writer, v any, d *Details) error {
	d.Files.placeholder = true
	b, err := json.Marshal(v)
	d.Files.placeholder = false
	if err != nil {
		return err
	}
	before, after, ok := bytes.Cut(b, []byte(filesPlaceholder))
	if !ok {
		_, err := w.Write(append(b, '\n'))
		return err
	}
	if _, err := w.Write(before); err != nil {
		return err
	}
	if err := d.Files.writeJSON(w); err != nil {
		return err
	}
	_, err = w.Write(append(after, '\n'))
	return err
}

func fileInfo(f layout.File) FileInfo {
	fi := FileInfo{Path: f.Path, Type: f.Type, Size: f.Size, Mode: f.Mode, Target: f.Target, digest: f.Digest}
	if f.Digest != "" {
		fi.SHA256 = f.Digest.Encoded()
	}
	return fi
}

// uniqueChunks returns the number and the bytes of the distinct chunks of
// an opened index, which lists each chunk once.
func uniqueChunks(x *layout.Index) (int, int64) {
	var n int64
	for k := range x.NumChunks() {
		n += x.ChunkSize(k)
	}
	return x.NumChunks(), n
}

// FileChange is a path present in both versions with different contents,
// type, mode or target.
type FileChange struct {
	Path    string `json:"path"`
	Type    string `json:"type"`
	OldSize int64  `json:"old_size"`
	Size    int64  `json:"size"`
}

// Diff compares version B with version A.
type Diff struct {
	A digest.Digest `json:"a"`
	B digest.Digest `json:"b"`

	Added     []FileInfo   `json:"added"`     // in B only
	Removed   []FileInfo   `json:"removed"`   // in A only
	Changed   []FileChange `json:"changed"`   // in both, different
	Unchanged int          `json:"unchanged"` // in both, identical

	ChunksA      int   `json:"chunks_a"`      // distinct chunks of A
	ChunksB      int   `json:"chunks_b"`      // distinct chunks of B
	SharedChunks int   `json:"shared_chunks"` // chunks of B that A has
	SharedBytes  int64 `json:"shared_bytes"`  // their bytes
	NewChunks    int   `json:"new_chunks"`    // chunks of B that A lacks
	NewBytes     int64 `json:"new_bytes"`     // their bytes
	// UploadBytes is what a push of B on top of A uploads: the new chunks
	// plus B's metadata blobs and manifests that A lacks.
	UploadBytes int64 `json:"upload_bytes"`
}

// Located is one version to compare: where it is and its root.
type Located struct {
	Src  content.Fetcher
	Desc ocispec.Descriptor
}

// Compare opens and verifies versions a and b and compares them at file and
// chunk level.
func Compare(ctx context.Context, a, b Located) (*Diff, error) {
	va, vb, err := openSides(ctx, a, b)
	if err != nil {
		return nil, err
	}
	d := &Diff{A: a.Desc.Digest, B: b.Desc.Digest, Added: []FileInfo{}, Removed: []FileInfo{}, Changed: []FileChange{}}
	// Both indexes are sorted by path: one merge, nothing held per file.
	xa, xb := va.Index, vb.Index
	i, j := 0, 0
	for i < xa.Len() || j < xb.Len() {
		switch {
		case j >= xb.Len() || (i < xa.Len() && xa.Path(i) < xb.Path(j)):
			d.Removed = append(d.Removed, fileInfo(xa.File(i)))
			i++
		case i >= xa.Len() || xb.Path(j) < xa.Path(i):
			d.Added = append(d.Added, fileInfo(xb.File(j)))
			j++
		default:
			old, f := fileInfo(xa.File(i)), fileInfo(xb.File(j))
			if old == f {
				d.Unchanged++
			} else {
				d.Changed = append(d.Changed, FileChange{Path: f.Path, Type: f.Type, OldSize: old.Size, Size: f.Size})
			}
			i++
			j++
		}
	}
	chunksA := map[digest.Digest]bool{}
	for k := range va.Index.NumChunks() {
		chunksA[va.Index.ChunkDigest(k)] = true
	}
	d.ChunksA = len(chunksA)
	seen := map[digest.Digest]bool{}
	for k := range vb.Index.NumChunks() {
		c := vb.Index.ChunkDigest(k)
		if seen[c] {
			continue
		}
		seen[c] = true
		if chunksA[c] {
			d.SharedChunks++
			d.SharedBytes += vb.Index.ChunkSize(k)
		} else {
			d.NewChunks++
			d.NewBytes += vb.Index.ChunkSize(k)
		}
	}
	d.ChunksB = len(seen)
	d.UploadBytes = d.NewBytes
	// The metadata comes from what layout.Open read and checked: nothing
	// here follows the manifests again.
	metaA := map[digest.Digest]bool{}
	for _, m := range va.Meta {
		metaA[m.Digest] = true
	}
	counted := map[digest.Digest]bool{}
	for _, m := range vb.Meta {
		if !metaA[m.Digest] && !chunksA[m.Digest] && !counted[m.Digest] {
			counted[m.Digest] = true
			d.UploadBytes += m.Size
		}
	}
	slices.SortFunc(d.Changed, func(x, y FileChange) int { return strings.Compare(x.Path, y.Path) })
	return d, nil
}

// openSides opens and verifies the versions a and b for a comparison: their
// indexes, without the chunk edges.
func openSides(ctx context.Context, a, b Located) (*layout.Version, *layout.Version, error) {
	va, err := origin.OpenWith(ctx, a.Src, a.Desc, layout.OpenOptions{SkipEdges: true})
	if err != nil {
		return nil, nil, err
	}
	vb, err := origin.OpenWith(ctx, b.Src, b.Desc, layout.OpenOptions{SkipEdges: true})
	if err != nil {
		return nil, nil, err
	}
	return va, vb, nil
}
