package push

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/semaphore"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

// Deltas: a chunk of a large file whose file, at the same path in the base
// version (Options.DeltaBase), has a whole chunk of the same size at the
// same offset, holding the same tensors (name, dtype, shape and place), is
// stored as its XOR with that chunk, in byte planes by dtype, compressed,
// when that is at most MaxDeltaRatio of it. A base chunk is always stored
// plain: when the base version's chunk is itself a delta, its own base is
// the base. The delta's base is read from a local copy of the base version
// (Options.DeltaBaseDir) where its bytes verify, else fetched from the
// destination (verified).

// MaxDeltaRatio is the largest delta kept, as a fraction of its chunk.
const MaxDeltaRatio = 0.7

// deltaJobs bounds the deltas computed at once (each holds a chunk, its
// base and the delta: up to some 50 MiB), and the bases got meanwhile.
const deltaJobs = 2

// baseKey names a chunk of the base version by where it is.
type baseKey struct {
	path string
	off  int64
}

// baseChunk is the base of a chunk: a chunk of the base version, stored
// plain.
type baseChunk struct {
	digest digest.Digest
	size   int64
	// own is the base version's chunk at the place (its plain digest):
	// the base itself, or when via is set, the chunk that delta encodes
	// against the base.
	own digest.Digest
	via *layout.Delta
}

// deltaBase is the base version as a push reads it.
type deltaBase struct {
	x      *layout.Index
	dst    content.Storage
	src    Source
	local  Source // a copy of the base version's tree, or nil
	chunks map[baseKey]baseChunk
	sem    *semaphore.Weighted // computing deltas
	// fetchSem bounds the bases being got (read or fetched) or waiting
	// for a place in sem.
	fetchSem *semaphore.Weighted
	sizeOf   func(p string) int64 // of a file of the source

	mu      sync.Mutex
	deltas  map[digest.Digest]layout.Delta
	headers map[string]*headerCall // new and base tensors, by "new:"/"base:" path

	plainBytes atomic.Int64 // bytes of chunks the deltas stand for
	deltaBytes atomic.Int64 // bytes of delta blobs uploaded
	baseLocal  atomic.Int64 // bytes of base chunks read from local
	baseRead   atomic.Int64 // bytes fetched from the destination to make deltas
}

// newDeltaBase indexes the whole chunks of x's large files by path and
// offset (a delta chunk by its base, which is plain).
func newDeltaBase(x *layout.Index, dst content.Storage, src, local Source, min int64, sizeOf func(string) int64) *deltaBase {
	b := &deltaBase{x: x, dst: dst, src: src, local: local, sizeOf: sizeOf, chunks: map[baseKey]baseChunk{}, sem: semaphore.NewWeighted(deltaJobs), fetchSem: semaphore.NewWeighted(deltaJobs),
		deltas: map[digest.Digest]layout.Delta{}, headers: map[string]*headerCall{}}
	for i := range x.Len() {
		f := x.File(i)
		if f.Type != layout.TypeFile || f.Size < min {
			continue
		}
		var off int64
		for _, e := range f.Extents {
			size := x.ChunkSize(e.Chunk)
			if e.Offset == 0 && e.Length == size {
				c := baseChunk{digest: x.ChunkDigest(e.Chunk), size: size}
				c.own = c.digest
				if d, ok := x.Delta(e.Chunk); ok {
					c.digest, c.via = d.Base, &d
				}
				b.chunks[baseKey{f.Path, off}] = c
			}
			off += e.Length
		}
	}
	return b
}

// tensorDesc is what matching compares of a tensor.
type tensorDesc struct {
	Name        string   `json:"-"`
	Dtype       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// tensors is a safetensors file's tensors by their place in the file.
type tensors struct {
	start int64 // where the data starts
	list  []tensorDesc
}

type headerCall struct {
	done chan struct{}
	t    *tensors // nil when not a safetensors file, or its header does not parse
}

// parseTensors parses a safetensors header (the bytes after the 8-byte
// length) of a file whose data starts at start.
func parseTensors(hdr []byte, start int64) *tensors {
	var m map[string]json.RawMessage
	if json.Unmarshal(hdr, &m) != nil {
		return nil
	}
	t := &tensors{start: start}
	for name, raw := range m {
		if name == "__metadata__" {
			continue
		}
		var d tensorDesc
		if json.Unmarshal(raw, &d) != nil {
			return nil
		}
		d.Name = name
		t.list = append(t.list, d)
	}
	sort.Slice(t.list, func(i, j int) bool { return t.list[i].DataOffsets[0] < t.list[j].DataOffsets[0] })
	return t
}

// overlapping returns the tensors of t that overlap the file bytes
// [off, off+n), and whether the range reaches into the header.
func (t *tensors) overlapping(off, n int64) ([]tensorDesc, bool) {
	var out []tensorDesc
	for _, d := range t.list {
		b, e := t.start+d.DataOffsets[0], t.start+d.DataOffsets[1]
		if b < off+n && e > off {
			out = append(out, d)
		}
	}
	return out, off < t.start
}

// newTensors returns the tensors of the source's file p (nil when none).
func (b *deltaBase) newTensors(p string, size int64) *tensors {
	return b.header("new:"+p, func() *tensors {
		f, err := b.src.Open(context.Background(), p)
		if err != nil {
			return nil
		}
		defer f.Close()
		hdr, err := tensorheader.ReadSafetensorsHeaderBytes(f, size, tensorheader.SafetensorsHeaderLimit)
		if err != nil {
			return nil
		}
		return parseTensors(hdr, 8+int64(len(hdr)))
	})
}

// baseTensors returns the tensors of the base version's file p, read from
// its chunks in the destination (verified), or nil.
func (b *deltaBase) baseTensors(ctx context.Context, p string) *tensors {
	return b.header("base:"+p, func() *tensors {
		i, ok := b.x.Find(p)
		if !ok {
			return nil
		}
		f := b.x.File(i)
		var pre [8]byte
		r := &baseFileReader{ctx: ctx, b: b, f: f}
		if _, err := r.ReadAt(pre[:], 0); err != nil {
			return nil
		}
		hdr, err := tensorheader.ReadSafetensorsHeaderBytes(r, f.Size, tensorheader.SafetensorsHeaderLimit)
		if err != nil {
			return nil
		}
		return parseTensors(hdr, 8+int64(len(hdr)))
	})
}

func (b *deltaBase) header(key string, parse func() *tensors) *tensors {
	b.mu.Lock()
	c, ok := b.headers[key]
	if !ok {
		c = &headerCall{done: make(chan struct{})}
		b.headers[key] = c
		b.mu.Unlock()
		c.t = parse()
		close(c.done)
		return c.t
	}
	b.mu.Unlock()
	<-c.done
	return c.t
}

// baseFileReader reads a file of the base version from its chunks, the
// last one fetched kept.
type baseFileReader struct {
	ctx  context.Context
	b    *deltaBase
	f    layout.File
	last int
	buf  []byte
}

func (r *baseFileReader) ReadAt(p []byte, off int64) (int, error) {
	done := 0
	var pos int64
	for _, e := range r.f.Extents {
		if done == len(p) {
			break
		}
		at := off + int64(done)
		if at >= pos+e.Length {
			pos += e.Length
			continue
		}
		if r.buf == nil || r.last != e.Chunk {
			desc := r.b.x.ChunkDescriptor(e.Chunk)
			r.buf = nil
			if e.Offset == 0 && e.Length == desc.Size {
				if r.buf = r.b.localChunk(r.ctx, r.f.Path, pos, desc); r.buf != nil {
					r.b.baseLocal.Add(desc.Size)
				}
			}
			if r.buf == nil {
				var err error
				src := layout.DeltaSource(r.b.dst, nil, r.b.x, nil)
				if r.buf, err = verify.Fetch(r.ctx, src, "chunk", desc); err != nil {
					r.buf = nil
					return done, err
				}
				r.b.baseRead.Add(desc.Size)
			}
			r.last = e.Chunk
		}
		within := at - pos
		n := copy(p[done:], r.buf[e.Offset+within:e.Offset+e.Length])
		done += n
		pos += e.Length
	}
	if done < len(p) {
		return done, io.EOF
	}
	return done, nil
}

// sameTensors reports whether two lists hold the same tensors: names,
// dtypes, shapes and places.
func sameTensors(a, b []tensorDesc) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || a[i].Dtype != b[i].Dtype || a[i].DataOffsets != b[i].DataOffsets || len(a[i].Shape) != len(b[i].Shape) {
			return false
		}
		for k := range a[i].Shape {
			if a[i].Shape[k] != b[i].Shape[k] {
				return false
			}
		}
	}
	return true
}

// planesOf returns the byte planes of a delta of the file bytes
// [off, off+n) holding the tensors ts: 2 when all are bf16 or fp16, 4 when
// all are fp32, each starting on a whole element; else raw.
func planesOf(ts []tensorDesc, inHeader bool, start, off int64) int {
	if inHeader || len(ts) == 0 {
		return layout.PlanesRaw
	}
	planes := 0
	for _, t := range ts {
		p := layout.PlanesRaw
		switch t.Dtype {
		case "BF16", "F16":
			p = layout.Planes16
		case "F32":
			p = layout.Planes32
		}
		if planes != 0 && p != planes {
			return layout.PlanesRaw
		}
		planes = p
	}
	for _, t := range ts {
		if (start+t.DataOffsets[0]-off)%int64(planes) != 0 {
			return layout.PlanesRaw // elements not on the planes' boundaries
		}
	}
	return planes
}

// match returns the base chunk of the chunk at off of file p (size fsize),
// of n bytes, and the planes of its delta.
func (b *deltaBase) match(ctx context.Context, p string, fsize, off, n int64) (baseChunk, int, bool) {
	c, ok := b.chunks[baseKey{p, off}]
	if !ok || c.size != n {
		return c, 0, false
	}
	if !tensorheader.IsSafetensors(p) {
		return c, layout.PlanesRaw, true
	}
	nt, bt := b.newTensors(p, fsize), b.baseTensors(ctx, p)
	if nt == nil || bt == nil {
		return c, layout.PlanesRaw, nt == nil && bt == nil
	}
	a, ah := nt.overlapping(off, n)
	z, zh := bt.overlapping(off, n)
	if ah != zh || nt.start != bt.start && (ah || zh) || !sameTensors(a, z) {
		return c, 0, false
	}
	return c, planesOf(a, ah, nt.start, off), true
}

// tryDelta stores chunk j as a delta when it has a base and the delta is
// small enough; it reports whether it did. Any failure to read the base
// leaves the chunk to be stored plain.
func (b *deltaBase) tryDelta(ctx context.Context, u *uploader, j chunkJob) (bool, error) {
	if d, ok := b.x.DeltaOf(j.Digest); ok {
		// The base version stores this very chunk as a delta (whose blob
		// and base it lists, so both are stored): it stays that delta.
		b.plainBytes.Add(j.Size)
		b.mu.Lock()
		b.deltas[j.Digest] = d
		b.mu.Unlock()
		return true, nil
	}
	if len(j.src) != 1 || j.Size < layout.EdgeBytes {
		return false, nil
	}
	sec := j.src[0]
	fsize := b.sizeOf(sec.path)
	bc, planes, ok := b.match(ctx, sec.path, fsize, sec.off, sec.n)
	if !ok || bc.digest == j.Digest {
		return false, nil
	}
	delta, ok, err := b.makeDelta(ctx, u, j, sec, bc, planes)
	if err != nil || !ok {
		return false, err
	}
	d := layout.Delta{Chunk: j.Digest, Size: j.Size, Digest: digest.FromBytes(delta), DeltaSize: int64(len(delta)), Base: bc.digest, Format: layout.DeltaFormat(delta)}
	dd := d.Descriptor()
	has, err := u.dst.Exists(ctx, dd)
	if err != nil {
		return false, fmt.Errorf("delta of chunk %s: %w", j.Digest, err)
	}
	if !has {
		if err := u.dst.Push(ctx, dd, bytes.NewReader(delta)); err != nil && !errdefAlreadyExists(err) {
			return false, fmt.Errorf("upload delta of chunk %s: %w", j.Digest, err)
		}
		u.chunks.Add(1)
		u.bytes.Add(d.DeltaSize)
		b.deltaBytes.Add(d.DeltaSize)
		u.counters.Sent.Add(d.DeltaSize)
	}
	b.plainBytes.Add(j.Size)
	b.mu.Lock()
	b.deltas[j.Digest] = d
	b.mu.Unlock()
	return true, nil
}

// makeDelta computes the delta of chunk j (at sec) against its base bc,
// and reports whether it is small enough to keep. At most deltaJobs
// compute at once (each holds a chunk, its base and the delta) and
// deltaJobs more get their bases meanwhile; the upload that follows holds
// no place, so that uploads of deltas overlap as those of chunks do.
func (b *deltaBase) makeDelta(ctx context.Context, u *uploader, j chunkJob, sec section, bc baseChunk, planes int) ([]byte, bool, error) {
	// The base first, under a place of its own, so that fetching the
	// next bases overlaps computing deltas.
	if err := b.fetchSem.Acquire(ctx, 1); err != nil {
		return nil, false, err
	}
	base, err := b.baseBytes(ctx, sec.path, sec.off, bc)
	if err != nil {
		b.fetchSem.Release(1)
		return nil, false, nil // stored plain
	}
	err = b.sem.Acquire(ctx, 1)
	b.fetchSem.Release(1)
	if err != nil {
		return nil, false, err
	}
	defer b.sem.Release(1)
	plain := j.data
	if plain == nil {
		plain = make([]byte, j.Size)
		sa := &sectionsAt{src: u.src, secs: j.src}
		_, err := sa.ReadAt(plain, 0)
		sa.Close()
		if err != nil {
			return nil, false, fmt.Errorf("chunk %s: %w", j.Digest, err)
		}
	}
	desc := j.Chunk.Descriptor()
	if err := verify.Bytes("chunk", plain, desc); err != nil {
		return nil, false, fmt.Errorf("%s: %w: %w", sec.path, ErrFileChanged, err)
	}
	delta, err := layout.EncodeDelta(plain, base, planes)
	if err != nil || float64(len(delta)) > MaxDeltaRatio*float64(j.Size) {
		return nil, false, nil
	}
	return delta, true, nil
}

// localChunk returns the chunk desc read from the local copy of the base
// version, at off of its file p, when those bytes are desc's; else nil.
func (b *deltaBase) localChunk(ctx context.Context, p string, off int64, desc ocispec.Descriptor) []byte {
	if b.local == nil {
		return nil
	}
	f, err := b.local.Open(ctx, p)
	if err != nil {
		return nil
	}
	defer f.Close()
	buf := make([]byte, desc.Size)
	if n, err := f.ReadAt(buf, off); n < len(buf) || err != nil && err != io.EOF {
		return nil
	}
	if verify.Bytes("base chunk", buf, desc) != nil {
		return nil
	}
	return buf
}

// baseBytes returns the bytes of bc, the base of the chunk at off of file
// p, verified: read from the local copy of the base version where its
// chunk there is bc (or, when that chunk is itself a delta, decoded back
// to bc from that delta, which is a small fetch), else fetched.
func (b *deltaBase) baseBytes(ctx context.Context, p string, off int64, bc baseChunk) ([]byte, error) {
	bd := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: bc.digest, Size: bc.size}
	own := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: bc.own, Size: bc.size}
	if buf := b.localChunk(ctx, p, off, own); buf != nil {
		if bc.via == nil {
			b.baseLocal.Add(bc.size)
			return buf, nil
		}
		// The delta of the base version's chunk against bc, XORed with
		// that chunk, is bc.
		if delta, err := verify.Fetch(ctx, b.dst, "delta", bc.via.Descriptor()); err == nil {
			b.baseRead.Add(int64(len(delta)))
			if base, err := layout.DecodeDeltaTo(buf, delta, buf, bc.size); err == nil && verify.Bytes("base chunk", base, bd) == nil {
				b.baseLocal.Add(bc.size)
				return base, nil
			}
		}
	}
	base, err := verify.Fetch(ctx, b.dst, "base chunk", bd)
	if err == nil {
		b.baseRead.Add(bc.size)
	}
	return base, err
}

func errdefAlreadyExists(err error) bool { return errors.Is(err, errdef.ErrAlreadyExists) }
