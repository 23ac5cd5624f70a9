package tensorheader

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// GGUF (the llama.cpp weights format) starts with a little-endian header:
// the magic "GGUF", a version (2 or 3), the tensor count, the metadata
// key-value count, the key-values, then one record per tensor (name,
// dimensions, ggml type, offset from the start of the tensor data). The
// tensor data starts at the next multiple of the alignment
// (general.alignment, 32 by default) after the header.

// GGUFHeaderLimit is the longest GGUF header (magic to tensor data) that
// is parsed. Headers hold the tokenizer's vocabulary: a 150,000-token
// vocabulary with its merges is some 10 MiB; 64 MiB leaves room.
const GGUFHeaderLimit = 64 << 20

// Bounds on the counts a GGUF header declares, checked before anything is
// allocated for them.
const (
	ggufMaxTensors = 1 << 20
	ggufMaxKV      = 1 << 20
	ggufMaxString  = 16 << 20
	ggufMaxDims    = 8
	ggufMaxDepth   = 4 // arrays of arrays
)

// ErrGGUF is wrapped when a GGUF header cannot be parsed or breaks the
// format's rules.
var ErrGGUF = errors.New("gguf: invalid header")

// GGUFTensor is one tensor of a GGUF file: its name, ggml type, dimensions
// and byte range relative to the start of the file.
type GGUFTensor struct {
	Tensor
	Type uint32
	Dims []uint64
}

// Dtype names the tensor's ggml type ("F16", "Q4_K"; "type 99" if unknown).
func (t GGUFTensor) Dtype() string { return GGUFTypeName(t.Type) }

// Elements is the number of values of the tensor.
func (t GGUFTensor) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// GGUFHeader is what bdnvol reads of a GGUF header.
type GGUFHeader struct {
	Version      uint32
	Alignment    uint64
	Architecture string // general.architecture, "" if absent
	DataStart    int64  // offset of the tensor data
	Tensors      []GGUFTensor
}

// IsGGUF reports whether a path names a GGUF file.
func IsGGUF(p string) bool { return strings.HasSuffix(p, ".gguf") }

// ggml types: block size in values and bytes per block.
var ggufTypes = map[uint32]struct {
	name         string
	block, bytes uint64
}{
	0: {"F32", 1, 4}, 1: {"F16", 1, 2}, 2: {"Q4_0", 32, 18}, 3: {"Q4_1", 32, 20},
	6: {"Q5_0", 32, 22}, 7: {"Q5_1", 32, 24}, 8: {"Q8_0", 32, 34}, 9: {"Q8_1", 32, 36},
	10: {"Q2_K", 256, 84}, 11: {"Q3_K", 256, 110}, 12: {"Q4_K", 256, 144},
	13: {"Q5_K", 256, 176}, 14: {"Q6_K", 256, 210}, 15: {"Q8_K", 256, 292},
	24: {"I8", 1, 1}, 25: {"I16", 1, 2}, 26: {"I32", 1, 4}, 27: {"I64", 1, 8},
	28: {"F64", 1, 8}, 30: {"BF16", 1, 2},
}

// GGUFTypeName names a ggml tensor type.
func GGUFTypeName(t uint32) string {
	if x, ok := ggufTypes[t]; ok {
		return x.name
	}
	return "type " + strconv.FormatUint(uint64(t), 10)
}

// ggufReader reads a header field by field, bounded by the bytes left.
type ggufReader struct {
	r    *bufio.Reader
	left int64 // bytes of the header limit not yet read
	pos  int64
}

func (g *ggufReader) read(p []byte) error {
	if int64(len(p)) > g.left {
		return fmt.Errorf("%w: longer than %d bytes", ErrGGUF, g.pos+g.left)
	}
	if _, err := io.ReadFull(g.r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("%w: at byte %d: %w", ErrGGUF, g.pos, err)
	}
	g.left -= int64(len(p))
	g.pos += int64(len(p))
	return nil
}

func (g *ggufReader) u32() (uint32, error) {
	var b [4]byte
	err := g.read(b[:])
	return binary.LittleEndian.Uint32(b[:]), err
}

func (g *ggufReader) u64() (uint64, error) {
	var b [8]byte
	err := g.read(b[:])
	return binary.LittleEndian.Uint64(b[:]), err
}

// skip discards n bytes.
func (g *ggufReader) skip(n uint64) error {
	if n > uint64(g.left) {
		return fmt.Errorf("%w: longer than %d bytes", ErrGGUF, g.pos+g.left)
	}
	m, err := g.r.Discard(int(n))
	g.left -= int64(m)
	g.pos += int64(m)
	if err != nil {
		return fmt.Errorf("%w: at byte %d: %w", ErrGGUF, g.pos, io.ErrUnexpectedEOF)
	}
	return nil
}

// str reads a string (a uint64 length, then bytes); keep=false skips it.
func (g *ggufReader) str(keep bool) (string, error) {
	n, err := g.u64()
	if err != nil {
		return "", err
	}
	if n > ggufMaxString {
		return "", fmt.Errorf("%w: string of %d bytes at byte %d", ErrGGUF, n, g.pos)
	}
	if !keep {
		return "", g.skip(n)
	}
	if n > uint64(g.left) {
		return "", fmt.Errorf("%w: longer than %d bytes", ErrGGUF, g.pos+g.left)
	}
	b := make([]byte, n)
	return string(b), g.read(b)
}

// GGUF metadata value types.
const (
	ggufString = 8
	ggufArray  = 9
)

// ggufScalarBytes is the size of each scalar value type.
var ggufScalarBytes = map[uint32]uint64{0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

// value reads a value of type typ; it returns the value of a string or
// uint32 when keep is set (general.architecture, general.alignment).
func (g *ggufReader) value(typ uint32, keep bool, depth int) (string, uint64, error) {
	if n, ok := ggufScalarBytes[typ]; ok {
		if typ == 4 && keep {
			v, err := g.u32()
			return "", uint64(v), err
		}
		return "", 0, g.skip(n)
	}
	switch typ {
	case ggufString:
		s, err := g.str(keep)
		return s, 0, err
	case ggufArray:
		if depth >= ggufMaxDepth {
			return "", 0, fmt.Errorf("%w: arrays nested deeper than %d", ErrGGUF, ggufMaxDepth)
		}
		et, err := g.u32()
		if err != nil {
			return "", 0, err
		}
		n, err := g.u64()
		if err != nil {
			return "", 0, err
		}
		if sz, ok := ggufScalarBytes[et]; ok {
			if n > uint64(g.left)/sz {
				return "", 0, fmt.Errorf("%w: array of %d values does not fit", ErrGGUF, n)
			}
			return "", 0, g.skip(n * sz)
		}
		// Every element takes at least 8 bytes (a length or a header).
		if n > uint64(g.left)/8 {
			return "", 0, fmt.Errorf("%w: array of %d values does not fit", ErrGGUF, n)
		}
		for range n {
			if _, _, err := g.value(et, false, depth+1); err != nil {
				return "", 0, err
			}
		}
		return "", 0, nil
	}
	return "", 0, fmt.Errorf("%w: value type %d at byte %d", ErrGGUF, typ, g.pos)
}

// ReadGGUFHeader parses the header of a GGUF file of the given size, of at
// most max bytes (GGUFHeaderLimit when max <= 0), reading it through a
// small buffer: memory grows with the tensor names, not with the counts
// the header declares. Tensors are sorted by offset and checked to lie
// inside the file without overlapping; a tensor of a known type ends where
// its values do, one of an unknown type where the next tensor (or the
// file) starts.
func ReadGGUFHeader(r io.ReaderAt, size, max int64) (*GGUFHeader, error) {
	return ReadGGUFHeaderFrom(io.NewSectionReader(r, 0, size), size, max)
}

// ReadGGUFHeaderFrom is ReadGGUFHeader for a file read from its start as a
// stream. It reads ahead of the header by up to 64 KiB.
func ReadGGUFHeaderFrom(r io.Reader, size, max int64) (*GGUFHeader, error) {
	if max <= 0 {
		max = GGUFHeaderLimit
	}
	g := &ggufReader{r: bufio.NewReaderSize(r, 64<<10), left: min(max, size)}
	var magic [4]byte
	if err := g.read(magic[:]); err != nil {
		return nil, err
	}
	if string(magic[:]) != "GGUF" {
		return nil, fmt.Errorf("%w: no GGUF magic", ErrGGUF)
	}
	h := &GGUFHeader{Alignment: 32}
	var err error
	if h.Version, err = g.u32(); err != nil {
		return nil, err
	}
	if h.Version != 2 && h.Version != 3 {
		return nil, fmt.Errorf("%w: version %d (want 2 or 3, little-endian)", ErrGGUF, h.Version)
	}
	nt, err := g.u64()
	if err != nil {
		return nil, err
	}
	nkv, err := g.u64()
	if err != nil {
		return nil, err
	}
	if nt > ggufMaxTensors || nkv > ggufMaxKV {
		return nil, fmt.Errorf("%w: %d tensors, %d metadata keys", ErrGGUF, nt, nkv)
	}
	if err := g.metadata(h, nkv); err != nil {
		return nil, err
	}
	if err := g.tensorInfos(h, nt); err != nil {
		return nil, err
	}
	start := (uint64(g.pos) + h.Alignment - 1) / h.Alignment * h.Alignment
	if start > uint64(size) {
		return nil, fmt.Errorf("%w: tensor data at %d past the end of a %d byte file", ErrGGUF, start, size)
	}
	h.DataStart = int64(start)
	return h, h.place(size)
}

// metadata reads the key-values, keeping general.alignment and
// general.architecture.
func (g *ggufReader) metadata(h *GGUFHeader, n uint64) error {
	for range n {
		key, err := g.str(true)
		if err != nil {
			return err
		}
		typ, err := g.u32()
		if err != nil {
			return err
		}
		keep := key == "general.alignment" && typ == 4 || key == "general.architecture" && typ == ggufString
		s, v, err := g.value(typ, keep, 0)
		if err != nil {
			return fmt.Errorf("key %q: %w", key, err)
		}
		switch {
		case key == "general.alignment" && typ == 4:
			if v == 0 || v&(v-1) != 0 || v > 1<<20 {
				return fmt.Errorf("%w: alignment %d", ErrGGUF, v)
			}
			h.Alignment = v
		case key == "general.alignment":
			return fmt.Errorf("%w: general.alignment of value type %d, want uint32", ErrGGUF, typ)
		case keep:
			h.Architecture = s
		}
	}
	return nil
}

// tensorInfos reads the tensor records.
func (g *ggufReader) tensorInfos(h *GGUFHeader, n uint64) error {
	// A record takes at least 24 bytes: no more are allocated than fit.
	h.Tensors = make([]GGUFTensor, 0, min(n, uint64(g.left)/24))
	for range n {
		name, err := g.str(true)
		if err != nil {
			return err
		}
		nd, err := g.u32()
		if err != nil {
			return err
		}
		if nd > ggufMaxDims {
			return fmt.Errorf("%w: tensor %q: %d dimensions", ErrGGUF, name, nd)
		}
		t := GGUFTensor{Tensor: Tensor{Name: name}, Dims: make([]uint64, nd)}
		elems := uint64(1)
		for i := range t.Dims {
			if t.Dims[i], err = g.u64(); err != nil {
				return err
			}
			hi, lo := bits.Mul64(elems, t.Dims[i])
			if hi != 0 || lo > math.MaxInt64 {
				return fmt.Errorf("%w: tensor %q: dimensions %v overflow", ErrGGUF, name, t.Dims[:i+1])
			}
			elems = lo
		}
		if t.Type, err = g.u32(); err != nil {
			return err
		}
		off, err := g.u64()
		if err != nil {
			return err
		}
		if off > math.MaxInt64/2 || off%h.Alignment != 0 {
			return fmt.Errorf("%w: tensor %q: offset %d (alignment %d)", ErrGGUF, name, off, h.Alignment)
		}
		t.Begin = int64(off) // relative until place
		h.Tensors = append(h.Tensors, t)
	}
	return nil
}

// place makes the tensors' ranges absolute, sorts them and checks them.
func (h *GGUFHeader) place(size int64) error {
	ts := h.Tensors
	seen := make(map[string]bool, len(ts))
	for i := range ts {
		if seen[ts[i].Name] {
			return fmt.Errorf("%w: tensor %q listed twice", ErrGGUF, ts[i].Name)
		}
		seen[ts[i].Name] = true
		ts[i].Begin += h.DataStart
		if ts[i].Begin > size {
			return fmt.Errorf("%w: tensor %q at %d past the end of a %d byte file", ErrGGUF, ts[i].Name, ts[i].Begin, size)
		}
	}
	slices.SortStableFunc(ts, func(a, b GGUFTensor) int { return int(min(max(a.Begin-b.Begin, -1), 1)) })
	for i := range ts {
		next := size
		if i+1 < len(ts) {
			next = ts[i+1].Begin
		}
		ts[i].End = next
		if x, ok := ggufTypes[ts[i].Type]; ok {
			e := ts[i].Elements()
			if e%x.block != 0 {
				return fmt.Errorf("%w: tensor %q: %d values of %s (blocks of %d)", ErrGGUF, ts[i].Name, e, x.name, x.block)
			}
			n := e / x.block
			if n > uint64(next-ts[i].Begin)/x.bytes {
				return fmt.Errorf("%w: tensor %q: %d values of %s do not fit before byte %d", ErrGGUF, ts[i].Name, e, x.name, next)
			}
			ts[i].End = ts[i].Begin + int64(n*x.bytes)
		}
	}
	return nil
}

// Ranges returns the tensors' byte ranges in file order, each running to
// the start of the next tensor (the last to the end of the file): the
// alignment padding after a tensor goes with it, so that cutting at these
// ranges gives no padding-only chunks.
func (h *GGUFHeader) Ranges(size int64) []Tensor {
	out := make([]Tensor, len(h.Tensors))
	for i, t := range h.Tensors {
		out[i] = Tensor{Name: t.Name, Begin: t.Begin, End: size}
		if i+1 < len(h.Tensors) {
			out[i].End = h.Tensors[i+1].Begin
		}
	}
	return out
}
