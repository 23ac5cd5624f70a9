package modelpack

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// Params are the chunking parameters of the index a model is read into:
// safetensors files are cut at tensor boundaries, so one tensor is one
// chunk (up to Max) and a mount reads it with one range request; other
// files are cut by content. Pack is 0: a chunk is one run of one file, one
// range of one layer.
var Params = layout.Params{Min: 1 << 20, Avg: 8 << 20, Max: 64 << 20}

// maxExpand bounds how many bytes a compressed layer may expand to, as a
// multiple of its size plus a constant: a tar bomb is refused, not stored.
const (
	maxExpand      = 1024
	maxExpandSlack = 1 << 30
)

// File is one regular file of an artifact: where its bytes are in which
// layer's (uncompressed) content, and whether it can be read by range.
type File struct {
	Path   string
	Layer  int   // index into Artifact.Layers
	Offset int64 // of its first byte in the layer's uncompressed content
	Size   int64
	Mode   uint32
	// Lazy is true when the layer can be read by range (raw or
	// uncompressed tar); a file of a compressed layer is read by
	// streaming its layer from the start.
	Lazy   bool
	Digest digest.Digest // SHA-256 of the file
	chunks []cut
}

// cut is a chunk of a file: its offset in the file, digest, size, edges.
type cut struct {
	off int64
	c   layout.Chunk
}

// Piece is where a chunk's bytes are: a run of one layer's uncompressed
// content.
type Piece struct {
	Layer  int
	Offset int64
	Size   int64
}

// Map is a model read once, whole, and verified layer by layer: its files,
// and the bdnvol file index they make, whose chunks are pieces of layers.
type Map struct {
	Artifact *Artifact
	Files    []File
	Index    *layout.Index
	Pieces   map[digest.Digest]Piece

	encoded []byte // Index, encoded (what an IndexCache keeps)
}

// Build reads every layer of a whole, each verified against its digest as
// it streams (and decompressed if it is compressed), lists the files of
// tar layers, cuts every file into chunks, and returns the map. Memory is
// bounded by the file count (and one safetensors header), never by the
// sizes layers or tar headers claim.
func Build(ctx context.Context, src content.Fetcher, a *Artifact) (*Map, error) {
	m := &Map{Artifact: a, Pieces: map[digest.Digest]Piece{}}
	seen := map[string]int{}
	for i, l := range a.Layers {
		n := len(m.Files)
		if err := m.readLayer(ctx, src, i, l); err != nil {
			return nil, fmt.Errorf("%s: layer %d (%s): %w", a.Desc.Digest, i, l.Desc.Digest, err)
		}
		for _, f := range m.Files[n:] {
			if j, dup := seen[f.Path]; dup {
				return nil, fmt.Errorf("%s: %w: %s is in layer %d and layer %d", a.Desc.Digest, ErrInvalid, termsafe.Short(f.Path), j, i)
			}
			seen[f.Path] = i
		}
	}
	x, err := m.index()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", a.Desc.Digest, err)
	}
	m.Index = x
	return m, nil
}

// readLayer streams layer i once, verified, adding its files and pieces.
func (m *Map) readLayer(ctx context.Context, src content.Fetcher, i int, l Layer) error {
	rc, err := src.Fetch(ctx, l.Desc)
	if err != nil {
		return err
	}
	defer rc.Close()
	vr := verify.Reader(rc, "layer", l.Desc)
	if l.Packing == PackingRaw {
		f := File{Path: l.Path, Layer: i, Size: l.Desc.Size, Mode: l.Mode, Lazy: true}
		if err := m.cutFile(ctx, vr, &f); err != nil {
			return err
		}
		m.Files = append(m.Files, f)
		return drain(vr)
	}
	r, closeFn, err := decompress(l, vr)
	if err != nil {
		return err
	}
	defer closeFn()
	if err := m.readTar(ctx, r, i, l); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, r); err != nil { // the tar's end, padding
		return err
	}
	return drain(vr)
}

// drain reads the rest of a layer and reports whether it verified.
func drain(vr *verify.VerifyingReader) error {
	if _, err := io.Copy(io.Discard, vr); err != nil {
		return err
	}
	if !vr.Verified() {
		return fmt.Errorf("%w: layer not read to its end", ErrInvalid)
	}
	return nil
}

// counter counts the bytes read through it.
type counter struct {
	r io.Reader
	n int64
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// decompress returns the uncompressed content of a layer read from r,
// bounded (maxExpand), counting what it gives.
func decompress(l Layer, r io.Reader) (*counter, func(), error) {
	limit := func(r io.Reader) *counter {
		return &counter{r: &boundedReader{r: r, left: l.Desc.Size*maxExpand + maxExpandSlack}}
	}
	switch l.Packing {
	case PackingRaw, PackingTar:
		return &counter{r: r}, func() {}, nil
	case PackingTarGzip:
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: gzip: %v", ErrInvalid, err)
		}
		return limit(zr), func() { zr.Close() }, nil
	case PackingTarZstd:
		zr, err := zstd.NewReader(r, zstd.WithDecoderMaxMemory(256<<20), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, fmt.Errorf("%w: zstd: %v", ErrInvalid, err)
		}
		return limit(zr), zr.Close, nil
	}
	return nil, nil, fmt.Errorf("%w: packing %q", ErrInvalid, l.Packing)
}

// errTooLarge is a compressed layer that expands past its bound.
var errTooLarge = errors.New("expands to more than the bound for its size (a tar bomb?)")

type boundedReader struct {
	r    io.Reader
	left int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("%w: layer %w", ErrInvalid, errTooLarge)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// readTar lists the tar read from r (layer i), cutting each regular file.
func (m *Map) readTar(ctx context.Context, r *counter, i int, l Layer) error {
	tr := tar.NewReader(r)
	for {
		h, p, err := NextFile(tr)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if len(m.Files) >= MaxFiles {
			return fmt.Errorf("%w: more than %d files", ErrInvalid, MaxFiles)
		}
		f := File{Path: p, Layer: i, Offset: r.n, Size: h.Size, Mode: TarMode(h), Lazy: l.Packing.RangeReadable()}
		if err := m.cutFile(ctx, tr, &f); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				err = fmt.Errorf("%w: it claims %d bytes, and the layer ends after %d of them: %w", ErrInvalid, h.Size, r.n-f.Offset, err)
			}
			return fmt.Errorf("%s: %w", termsafe.Short(p), err)
		}
		m.Files = append(m.Files, f)
	}
}

// NextFile advances tr to the next regular file of a model layer and
// returns its header and path: directories (and the "./" of a tar made
// from a directory) are skipped, as their files make them. It returns
// io.EOF at the end, and an error wrapping ErrInvalid for a member bdnvol
// does not read (links, devices, sparse members, unsafe paths) or a
// damaged tar. Every reader of model tars (Build, sync) lists files
// through it, so they agree on what a layer holds.
func NextFile(tr *tar.Reader) (*tar.Header, string, error) {
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, "", io.EOF
		}
		if err != nil {
			return nil, "", fmt.Errorf("%w: tar: %w", ErrInvalid, err)
		}
		p, err := tarEntry(h)
		if err != nil {
			return nil, "", err
		}
		if p != "" {
			return h, p, nil
		}
	}
}

// Decompress returns the uncompressed content of layer l read from r
// (bounded: a tar bomb fails with ErrInvalid) and a function that frees
// the decompressor.
func Decompress(l Layer, r io.Reader) (io.Reader, func(), error) {
	c, closeFn, err := decompress(l, r)
	if err != nil {
		return nil, nil, err
	}
	return c, closeFn, nil
}

// tarEntry checks a tar header: the path of a regular file, "" for a
// directory, an error for anything else.
func tarEntry(h *tar.Header) (string, error) {
	if h.Typeflag == tar.TypeDir {
		if d := strings.TrimLeft(h.Name, "./"); d == "" {
			return "", nil // "./" or ".": the layer's own root
		}
	}
	p, err := CheckPath(h.Name)
	if err != nil {
		return "", err
	}
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // old tars say TypeRegA
	case tar.TypeDir:
		return "", nil
	case tar.TypeSymlink, tar.TypeLink:
		return "", fmt.Errorf("%w: %s is a link (to %s): links in model layers are refused", ErrInvalid, termsafe.Short(p), termsafe.Short(h.Linkname))
	default:
		return "", fmt.Errorf("%w: %s has tar type %q, not a regular file or directory", ErrInvalid, termsafe.Short(p), h.Typeflag)
	}
	if h.Size < 0 || h.Size > MaxLayerBytes {
		return "", fmt.Errorf("%w: %s claims %d bytes", ErrInvalid, termsafe.Short(p), h.Size)
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			// Its bytes in the layer are not the file's: refused.
			return "", fmt.Errorf("%w: %s is a sparse member (PAX %s)", ErrInvalid, termsafe.Short(p), termsafe.Short(k))
		}
	}
	return p, nil
}

// cutFile reads f.Size bytes from r, hashing them and cutting them into
// chunks, and records where each chunk lies in its layer.
func (m *Map) cutFile(ctx context.Context, r io.Reader, f *File) error {
	h := sha256.New()
	err := layout.CutStream(ctx, io.TeeReader(r, h), f.Path, f.Size, Params, func(off int64, c layout.Chunk) {
		if !f.Lazy {
			c.Head, c.Tail = "", "" // no range of a compressed layer is read alone
		}
		f.chunks = append(f.chunks, cut{off, c})
	})
	if err != nil {
		return err
	}
	f.Digest = digest.NewDigest(digest.SHA256, h)
	for _, c := range f.chunks {
		if _, ok := m.Pieces[c.c.Digest]; !ok {
			m.Pieces[c.c.Digest] = Piece{Layer: f.Layer, Offset: f.Offset + c.off, Size: c.c.Size}
		}
	}
	return nil
}

// index builds the bdnvol file index of the files (directories for every
// parent), validated as any index is.
func (m *Map) index() (*layout.Index, error) {
	x := &layout.Index{Version: layout.FormatVersion1, Chunking: Params}
	chunkOf := map[digest.Digest]int{}
	dirs := map[string]bool{}
	for _, f := range m.Files {
		for d := parent(f.Path); d != "" && !dirs[d]; d = parent(d) {
			dirs[d] = true
			x.Files = append(x.Files, layout.File{Path: d, Type: layout.TypeDir, Mode: 0o755})
		}
		e := layout.File{Path: f.Path, Type: layout.TypeFile, Mode: f.Mode, Size: f.Size, Digest: f.Digest}
		for _, c := range f.chunks {
			ci, ok := chunkOf[c.c.Digest]
			if !ok {
				ci = len(x.Chunks)
				chunkOf[c.c.Digest] = ci
				x.Chunks = append(x.Chunks, c.c)
			}
			e.Extents = append(e.Extents, layout.Extent{Chunk: ci, Offset: 0, Length: c.c.Size})
		}
		x.Files = append(x.Files, e)
	}
	for i := range m.Files {
		m.Files[i].chunks = nil
	}
	sort.Slice(x.Files, func(i, j int) bool { return x.Files[i].Path < x.Files[j].Path })
	b, err := x.Encode()
	if err != nil {
		return nil, err
	}
	m.encoded = b
	return layout.DecodeIndex(b)
}

func parent(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return ""
}
