package versions

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

// keepBudget bounds the bytes of fetched chunks a tensor diff keeps to read
// again (a header chunk both versions share, a chunk several undecided
// tensors share); a chunk past it is fetched again if needed.
const keepBudget = 16 << 20

// TensorInfo is one tensor as a tensor diff reports it.
type TensorInfo struct {
	File  string  `json:"file"`
	Name  string  `json:"name"`
	Dtype string  `json:"dtype"`
	Shape []int64 `json:"shape"`
	Bytes int64   `json:"bytes"`
}

// TensorChange is a tensor present in both versions with another dtype,
// shape or bytes; What lists which.
type TensorChange struct {
	TensorInfo
	OldDtype string   `json:"old_dtype"`
	OldShape []int64  `json:"old_shape"`
	OldBytes int64    `json:"old_bytes"`
	What     []string `json:"what"` // "dtype", "shape", "bytes"
}

// TensorDiff compares the tensors of the safetensors and GGUF files of two
// versions.
// A tensor is named by its file and name; one that moved to another shard
// is removed from one and added to the other.
type TensorDiff struct {
	A digest.Digest `json:"a"`
	B digest.Digest `json:"b"`

	Files     []string       `json:"files"` // safetensors and GGUF files compared
	Added     []TensorInfo   `json:"added"`
	Removed   []TensorInfo   `json:"removed"`
	Changed   []TensorChange `json:"changed"`
	Unchanged int            `json:"unchanged"`
	// Undecided are tensors with the same dtype and shape whose bytes share
	// a changed chunk with other tensors: telling whether they changed
	// would take fetching that chunk.
	Undecided []TensorInfo `json:"undecided"`

	AddedBytes     int64 `json:"added_bytes"`
	RemovedBytes   int64 `json:"removed_bytes"`
	ChangedBytes   int64 `json:"changed_bytes"` // in B
	UnchangedBytes int64 `json:"unchanged_bytes"`
	UndecidedBytes int64 `json:"undecided_bytes"`

	// HeaderChunks is how many chunks were fetched to read the headers;
	// SharedChunks how many more TensorOptions.Resolve fetched.
	HeaderChunks int `json:"header_chunks"`
	SharedChunks int `json:"shared_chunks_fetched"`
}

// tensor is a tensor with where its bytes are stored.
type tensor struct {
	TensorInfo
	pieces []piece
	r      *fileReader
	begin  int64
}

// TensorOptions configure CompareTensors.
type TensorOptions struct {
	// Resolve fetches the chunks that undecided tensors share with others
	// and compares their bytes, so that none stays undecided.
	Resolve bool
}

// sameBytes reads both tensors' bytes and compares them.
func sameBytes(a, b tensor) (bool, error) {
	if a.Bytes != b.Bytes {
		return false, nil
	}
	defer a.r.drop()
	defer b.r.drop()
	x, y := make([]byte, a.Bytes), make([]byte, b.Bytes)
	if _, err := a.r.ReadAt(x, a.begin); err != nil {
		return false, fmt.Errorf("%s: tensor %q: %w", a.File, a.Name, err)
	}
	if _, err := b.r.ReadAt(y, b.begin); err != nil {
		return false, fmt.Errorf("%s: tensor %q: %w", b.File, b.Name, err)
	}
	return string(x) == string(y), nil
}

// piece is a run of a tensor's bytes inside a chunk.
type piece struct {
	chunk       digest.Digest
	off, length int64
	whole       bool // the piece is the whole chunk
}

// own reports whether the tensor's bytes are whole chunks of their own.
func (t tensor) own() bool {
	for _, p := range t.pieces {
		if !p.whole {
			return false
		}
	}
	return true
}

// CompareTensors compares the tensors of the safetensors and GGUF files of
// a and b.
// It reads the file indexes and the chunks that hold the headers only: a
// tensor's bytes are unchanged exactly when the chunk extents that hold them
// are, and chunks are cut at tensor boundaries.
func CompareTensors(ctx context.Context, a, b Located, opt TensorOptions) (*TensorDiff, error) {
	va, vb, err := openSides(ctx, a, b)
	if err != nil {
		return nil, err
	}
	d := &TensorDiff{A: a.Desc.Digest, B: b.Desc.Digest, Files: []string{}, Added: []TensorInfo{}, Removed: []TensorInfo{}, Changed: []TensorChange{}, Undecided: []TensorInfo{}}
	// Same bytes give the same chunks only under the same chunking.
	sameChunking := va.Index.Chunking == vb.Index.Chunking
	fetched := &chunkMemo{seen: map[digest.Digest]bool{}, kept: map[digest.Digest][]byte{}}
	ta, err := tensorsOf(ctx, a.Src, va, fetched)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", a.Desc.Digest, err)
	}
	tb, err := tensorsOf(ctx, b.Src, vb, fetched)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Desc.Digest, err)
	}
	d.HeaderChunks = len(fetched.seen)
	files := map[string]bool{}
	for k, t := range tb {
		files[t.File] = true
		old, ok := ta[k]
		if !ok {
			d.Added = append(d.Added, t.TensorInfo)
			d.AddedBytes += t.Bytes
			continue
		}
		var what []string
		if old.Dtype != t.Dtype {
			what = append(what, "dtype")
		}
		if !slices.Equal(old.Shape, t.Shape) {
			what = append(what, "shape")
		}
		if !slices.Equal(old.pieces, t.pieces) {
			undecided := len(what) == 0 && !(sameChunking && old.own() && t.own())
			if undecided && opt.Resolve {
				same, err := sameBytes(old, t)
				if err != nil {
					return nil, err
				}
				if same {
					d.Unchanged++
					d.UnchangedBytes += t.Bytes
					continue
				}
				undecided = false
			}
			if undecided {
				d.Undecided = append(d.Undecided, t.TensorInfo)
				d.UndecidedBytes += t.Bytes
				continue
			}
			what = append(what, "bytes")
		}
		if len(what) == 0 {
			d.Unchanged++
			d.UnchangedBytes += t.Bytes
			continue
		}
		d.Changed = append(d.Changed, TensorChange{TensorInfo: t.TensorInfo, OldDtype: old.Dtype, OldShape: old.Shape, OldBytes: old.Bytes, What: what})
		d.ChangedBytes += t.Bytes
	}
	d.SharedChunks = len(fetched.seen) - d.HeaderChunks
	for k, t := range ta {
		files[t.File] = true
		if _, ok := tb[k]; !ok {
			d.Removed = append(d.Removed, t.TensorInfo)
			d.RemovedBytes += t.Bytes
		}
	}
	for f := range files {
		d.Files = append(d.Files, f)
	}
	sort.Strings(d.Files)
	byName := func(x, y TensorInfo) int {
		if c := strings.Compare(x.File, y.File); c != 0 {
			return c
		}
		return strings.Compare(x.Name, y.Name)
	}
	slices.SortFunc(d.Added, byName)
	slices.SortFunc(d.Removed, byName)
	slices.SortFunc(d.Undecided, byName)
	slices.SortFunc(d.Changed, func(x, y TensorChange) int { return byName(x.TensorInfo, y.TensorInfo) })
	return d, nil
}

// tensorsOf reads the headers of v's safetensors and GGUF files, keyed by
// file and tensor name. fetched is what was fetched so far, shared by both
// sides. A header longer than tensorheader.SafetensorsHeaderLimit (or
// tensorheader.GGUFHeaderLimit) is an error.
func tensorsOf(ctx context.Context, src content.Fetcher, v *layout.Version, fetched *chunkMemo) (map[string]tensor, error) {
	out := map[string]tensor{}
	for i := range v.Index.Len() {
		fv := v.Index.File(i)
		f := &fv
		if f.Type != layout.TypeFile || !tensorheader.IsSafetensors(f.Path) && !tensorheader.IsGGUF(f.Path) {
			continue
		}
		r := &fileReader{ctx: ctx, src: src, v: v, f: f, fetched: fetched}
		var ts []tensor
		var err error
		if tensorheader.IsGGUF(f.Path) {
			ts, err = ggufTensors(r)
		} else {
			ts, err = safetensorsTensors(r)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Path, err)
		}
		for _, t := range ts {
			out[f.Path+"\x00"+t.Name] = t
		}
	}
	return out, nil
}

// safetensorsTensors reads the tensors of the safetensors file r reads.
func safetensorsTensors(r *fileReader) ([]tensor, error) {
	f := r.f
	hdr, err := tensorheader.ReadSafetensorsHeaderBytes(r, f.Size, tensorheader.SafetensorsHeaderLimit)
	r.drop()
	if err != nil {
		return nil, err
	}
	_, ranges, err := tensorheader.ParseSafetensorsHeader(hdr, f.Size)
	if err != nil {
		return nil, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	var out []tensor
	for _, rg := range ranges {
		var meta struct {
			Dtype string  `json:"dtype"`
			Shape []int64 `json:"shape"`
		}
		if err := json.Unmarshal(raw[rg.Name], &meta); err != nil {
			return nil, fmt.Errorf("tensor %q: %w", rg.Name, err)
		}
		if meta.Shape == nil {
			meta.Shape = []int64{}
		}
		t := tensor{TensorInfo: TensorInfo{File: f.Path, Name: rg.Name, Dtype: meta.Dtype, Shape: meta.Shape, Bytes: rg.End - rg.Begin}}
		t.pieces = piecesOf(r.v, f, rg.Begin, rg.End)
		t.r, t.begin = r, rg.Begin
		out = append(out, t)
	}
	return out, nil
}

// ggufTensors reads the tensors of the GGUF file r reads. A tensor's
// pieces run to the next tensor (its alignment padding included), as
// chunks are cut; its Bytes are its values'.
func ggufTensors(r *fileReader) ([]tensor, error) {
	f := r.f
	h, err := tensorheader.ReadGGUFHeader(r, f.Size, tensorheader.GGUFHeaderLimit)
	r.drop()
	if err != nil {
		return nil, err
	}
	ranges := h.Ranges(f.Size)
	out := make([]tensor, 0, len(h.Tensors))
	for i, gt := range h.Tensors {
		shape := make([]int64, len(gt.Dims))
		for j, d := range gt.Dims {
			shape[j] = int64(d) // bounded by the parser: the product fits an int64
		}
		t := tensor{TensorInfo: TensorInfo{File: f.Path, Name: gt.Name, Dtype: gt.Dtype(), Shape: shape, Bytes: gt.End - gt.Begin}}
		t.pieces = piecesOf(r.v, f, ranges[i].Begin, ranges[i].End)
		t.r, t.begin = r, gt.Begin
		out = append(out, t)
	}
	return out, nil
}

// piecesOf returns the chunk runs that hold bytes [begin, end) of f.
func piecesOf(v *layout.Version, f *layout.File, begin, end int64) []piece {
	var ps []piece
	var pos int64
	for _, e := range f.Extents {
		s, t := max(pos, begin), min(pos+e.Length, end)
		if s < t {
			c := v.Index.Chunk(e.Chunk)
			off := e.Offset + s - pos
			ps = append(ps, piece{chunk: c.Digest, off: off, length: t - s, whole: off == 0 && t-s == c.Size})
		}
		pos += e.Length
		if pos >= end {
			break
		}
	}
	return ps
}

// chunkMemo is what a tensor diff fetched: every chunk's digest, for the
// counts, and the bytes of the first chunks up to keepBudget, to read again.
type chunkMemo struct {
	seen map[digest.Digest]bool
	kept map[digest.Digest][]byte
	size int64 // bytes in kept
}

// add records the fetched chunk d, keeping its bytes b if they fit.
func (m *chunkMemo) add(d digest.Digest, b []byte) {
	m.seen[d] = true
	if _, ok := m.kept[d]; !ok && m.size+int64(len(b)) <= keepBudget {
		m.kept[d] = b
		m.size += int64(len(b))
	}
}

// fileReader reads a file of a version by fetching (and verifying) the
// whole chunks that hold the bytes asked for.
type fileReader struct {
	ctx     context.Context
	src     content.Fetcher
	v       *layout.Version
	f       *layout.File
	fetched *chunkMemo
	// The chunk read last, while the header is read piece by piece or a
	// tensor compared; drop lets it go.
	last      []byte
	lastChunk digest.Digest
}

// drop forgets the chunk read last.
func (r *fileReader) drop() { r.last, r.lastChunk = nil, "" }

// chunk returns the bytes of c: the chunk read last, a kept one, or
// fetched.
func (r *fileReader) chunk(c layout.Chunk) ([]byte, error) {
	if r.last != nil && r.lastChunk == c.Digest {
		return r.last, nil
	}
	b, ok := r.fetched.kept[c.Digest]
	if !ok {
		var err error
		b, err = verify.Fetch(r.ctx, r.src, "", ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: c.Digest, Size: c.Size})
		if err != nil {
			return nil, fmt.Errorf("chunk %s: %w", c.Digest, err)
		}
		r.fetched.add(c.Digest, b)
	}
	r.last, r.lastChunk = b, c.Digest
	return b, nil
}

// ReadAt reads len(p) bytes at off.
func (r *fileReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= r.f.Size {
		return 0, io.EOF
	}
	n := 0
	var pos int64
	for _, e := range r.f.Extents {
		if n == len(p) {
			break
		}
		want := off + int64(n)
		if want >= pos+e.Length {
			pos += e.Length
			continue
		}
		c := r.v.Index.Chunk(e.Chunk)
		b, err := r.chunk(c)
		if err != nil {
			return n, err
		}
		in := want - pos
		if e.Offset+e.Length > int64(len(b)) {
			return n, fmt.Errorf("chunk %s: extent past its end: %w", c.Digest, layout.ErrNotVolume)
		}
		n += copy(p[n:], b[e.Offset+in:e.Offset+e.Length])
		pos += e.Length
	}
	if n < len(p) {
		return n, io.ErrUnexpectedEOF
	}
	return n, nil
}
