package layout

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/klauspost/compress/zstd"
)

// The sparse delta encoding (format version 4): a delta blob "BDX2" holds
// each byte plane of the XOR of a chunk with its base as its own zstd
// frame, in one of two forms the encoder picks per plane, whichever is
// smaller: dense (the plane's bytes, as in a "BDX1" blob) or sparse (a
// bitmap of the plane's nonzero bytes, then those bytes). The XOR of a
// small training step is mostly zero bytes: zstd decodes the sparse form,
// about an eighth of the bytes, several times faster than it rebuilds
// the long runs of zeros of the dense one, and the reader XORs in only the
// bytes the bitmap marks.

// sparseMagic starts a delta blob of the sparse encoding.
var sparseMagic = [4]byte{'B', 'D', 'X', '2'}

// Forms of a plane in a sparse delta blob.
const (
	formDense  = 0 // the plane's bytes
	formSparse = 1 // a bitmap of its nonzero bytes, then those bytes
)

// sparseMaxDensity is the share of nonzero bytes past which the encoder
// tries the dense form of a plane as well (below it the sparse form was
// always the smaller in measurements); the smaller of the two is kept.
const sparseMaxDensity = 3.0 / 8

// FormatVersion4 is the format of a version some of whose delta blobs use
// the sparse encoding: version 3's layers and tables under a top-level
// index of media type MediaTypeIndexV4.
const FormatVersion4 = 4

// MediaTypeIndexV4 is the media type of the top-level file index of format
// version 4: a reader of version 3 refuses it and says to upgrade.
const MediaTypeIndexV4 = "application/vnd.bdnvol.index.v4+json"

// DeltaFormat returns the format version a version storing the delta blob
// b needs: FormatVersion4 for a blob of the sparse encoding, else
// FormatVersion3.
func DeltaFormat(b []byte) int {
	if len(b) >= len(sparseMagic) && bytes.Equal(b[:len(sparseMagic)], sparseMagic[:]) {
		return FormatVersion4
	}
	return FormatVersion3
}

// encodeSparse returns the delta blob of the planes x (split's output, of
// planes planes): each plane in the smaller of its forms. It returns nil
// when every plane is smaller dense: the caller then writes the "BDX1"
// blob.
func encodeSparse(enc *zstd.Encoder, x []byte, planes int) []byte {
	n := len(x)
	m := n / planes
	var (
		form   [4]byte
		count  [4]int
		frames [4][]byte
		sparse bool
	)
	for p := range planes {
		pl := x[p*m : (p+1)*m]
		k := nonzero(pl)
		sp := sparseForm(pl, k)
		frames[p] = enc.EncodeAll(sp, nil)
		form[p], count[p] = formSparse, k
		if float64(k) > sparseMaxDensity*float64(m) {
			if d := enc.EncodeAll(pl, nil); len(d) < len(frames[p]) {
				frames[p], form[p], count[p] = d, formDense, 0
			}
		}
		sparse = sparse || form[p] == formSparse
	}
	if !sparse {
		return nil
	}
	size := len(sparseMagic) + 1 + n - m*planes
	for p := range planes {
		size += 1 + 4 + len(frames[p])
		if form[p] == formSparse {
			size += 4
		}
	}
	out := make([]byte, 0, size)
	out = append(out, sparseMagic[:]...)
	out = append(out, byte(planes))
	for p := range planes {
		out = append(out, form[p])
		if form[p] == formSparse {
			out = binary.LittleEndian.AppendUint32(out, uint32(count[p]))
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(frames[p])))
	}
	out = append(out, x[m*planes:]...)
	for p := range planes {
		out = append(out, frames[p]...)
	}
	return out
}

// nonzero counts the bytes of b that are not zero.
func nonzero(b []byte) int {
	k, i := 0, 0
	for ; i+8 <= len(b); i += 8 {
		if w := binary.LittleEndian.Uint64(b[i:]); w != 0 {
			// A byte is nonzero when any of its bits is: fold them into
			// its high bit.
			w |= w >> 4
			w |= w >> 2
			w |= w >> 1
			k += bits.OnesCount64(w & 0x0101010101010101)
		}
	}
	for ; i < len(b); i++ {
		if b[i] != 0 {
			k++
		}
	}
	return k
}

// sparseForm returns the sparse form of plane pl, which has k nonzero
// bytes: a bitmap of ⌈len(pl)/8⌉ bytes (bit i mod 8 of byte i/8 set when
// byte i is not zero), then the k nonzero bytes in order.
func sparseForm(pl []byte, k int) []byte {
	nb := (len(pl) + 7) / 8
	out := make([]byte, nb+k)
	bm, vals := out[:nb], out[nb:nb]
	i := 0
	for ; i+8 <= len(pl); i += 8 {
		w := binary.LittleEndian.Uint64(pl[i:])
		if w == 0 {
			continue
		}
		var b byte
		for e := range 8 {
			if c := byte(w >> (8 * e)); c != 0 {
				b |= 1 << e
				vals = append(vals, c)
			}
		}
		bm[i/8] = b
	}
	for ; i < len(pl); i++ {
		if pl[i] != 0 {
			bm[i/8] |= 1 << (i % 8)
			vals = append(vals, pl[i])
		}
	}
	return out
}

// xdelta is a decoded delta blob: the XOR of a chunk of size bytes with
// its base, by plane, in a pooled buffer. Its xorRange XORs it into a
// buffer holding the base (or the chunk), a range of elements at a time.
type xdelta struct {
	size, planes, m int
	buf             *[]byte
	flat            []byte // a "BDX1" blob's planes and tail, one after another
	pl              [4]xplane
	tail            []byte // a "BDX2" blob's last size mod planes bytes
	next            int    // the element the cursors of the sparse planes are at
}

// xplane is a plane of a decoded "BDX2" blob.
type xplane struct {
	form   byte
	dense  []byte // formDense: the plane
	bitmap []byte // formSparse: which bytes are nonzero
	vals   []byte // formSparse: the nonzero bytes
	k      int    // values before element next
}

// release returns the buffer to its pool; d must not be used after.
func (d *xdelta) release() {
	if d != nil {
		putBuf(d.buf)
		d.buf = nil
	}
}

// xorAll XORs the whole delta into dst, of size bytes: it turns the base
// into the chunk and the chunk into the base.
func (d *xdelta) xorAll(dst []byte) { d.xorRange(dst, 0, d.m) }

// xorRange XORs elements lo to hi of the delta into dst, as
// xorPlanesRange (lo a multiple of 8, hi too unless it is m, when the bytes
// past the last whole element go too). Ranges taken in order cost only
// their elements; another costs a count of the bitmaps up to lo.
func (d *xdelta) xorRange(dst []byte, lo, hi int) {
	dst = dst[:d.size]
	if d.flat != nil {
		xorPlanesRange(dst, d.flat, d.planes, lo, hi)
		return
	}
	if lo != d.next {
		for p := range d.planes {
			if pl := &d.pl[p]; pl.form == formSparse {
				pl.k = popcount(pl.bitmap[:lo/8])
			}
		}
	}
	for p := range d.planes {
		pl := &d.pl[p]
		if pl.form == formDense {
			xorDense(dst, pl.dense, d.planes, p, lo, hi)
		} else {
			pl.k = scatter(dst, pl.bitmap, pl.vals, pl.k, d.planes, p, lo, hi)
		}
	}
	d.next = hi
	if hi == d.m {
		end := d.m * d.planes
		for j, c := range d.tail {
			dst[end+j] ^= c
		}
	}
}

// popcount counts the set bits of b.
func popcount(b []byte) int {
	k, i := 0, 0
	for ; i+8 <= len(b); i += 8 {
		k += bits.OnesCount64(binary.LittleEndian.Uint64(b[i:]))
	}
	for ; i < len(b); i++ {
		k += bits.OnesCount8(b[i])
	}
	return k
}

// scatter XORs the nonzero bytes vals of plane p, from vals[k] on, into
// the elements lo to hi of dst (planes bytes each) that bitmap marks, 64
// elements a word, a word without a mark skipped; it returns the index of
// the next value.
func scatter(dst, bitmap, vals []byte, k, planes, p, lo, hi int) int {
	for w := lo; w < hi; w += 64 {
		b := bitmap[w/8:]
		var v uint64
		if len(b) >= 8 {
			v = binary.LittleEndian.Uint64(b)
		} else {
			for i, c := range b {
				v |= uint64(c) << (8 * i)
			}
		}
		if n := hi - w; n < 64 {
			v &= 1<<n - 1
		}
		for v != 0 {
			i := w + bits.TrailingZeros64(v)
			dst[i*planes+p] ^= vals[k]
			k++
			v &= v - 1
		}
	}
	return k
}

// xorDense XORs elements lo to hi of the dense plane pl, byte p of every
// element of planes bytes, into dst, 8 elements at a time, a group of
// zeros skipped.
func xorDense(dst, pl []byte, planes, p, lo, hi int) {
	i := lo
	switch planes {
	case PlanesRaw:
		for ; i+8 <= hi; i += 8 {
			if w := binary.LittleEndian.Uint64(pl[i:]); w != 0 {
				binary.LittleEndian.PutUint64(dst[i:], w^binary.LittleEndian.Uint64(dst[i:]))
			}
		}
	case Planes16:
		for ; i+8 <= hi; i += 8 {
			a := binary.LittleEndian.Uint64(pl[i:])
			if a == 0 {
				continue
			}
			d := dst[2*i : 2*i+16]
			w0 := spread16(uint32(a)) << (8 * p)
			w1 := spread16(uint32(a>>32)) << (8 * p)
			binary.LittleEndian.PutUint64(d[:8], w0^binary.LittleEndian.Uint64(d[:8]))
			binary.LittleEndian.PutUint64(d[8:], w1^binary.LittleEndian.Uint64(d[8:]))
		}
	default:
		for ; i+8 <= hi; i += 8 {
			a := binary.LittleEndian.Uint64(pl[i:])
			if a == 0 {
				continue
			}
			d := dst[planes*i : planes*(i+8)]
			for e := range 8 {
				d[planes*e+p] ^= byte(a >> (8 * e))
			}
		}
	}
	for ; i < hi; i++ {
		dst[i*planes+p] ^= pl[i]
	}
}

// decodeSparse decodes the "BDX2" blob delta of a chunk of size bytes
// (its magic checked) into a pooled buffer. It decodes at most the bytes
// the header promises (at most 9/8 of size): a header that does not add
// up, a frame that holds more or fewer bytes than its plane, a bitmap that
// marks another number of bytes than its count, are refused with ErrDelta.
func decodeSparse(delta []byte, size int64) (*xdelta, error) {
	h := delta[len(sparseMagic):]
	if len(h) < 1 {
		return nil, fmt.Errorf("%w: a truncated sparse delta header", ErrDelta)
	}
	planes := int(h[0])
	h = h[1:]
	if planes != PlanesRaw && planes != Planes16 && planes != Planes32 {
		return nil, fmt.Errorf("%w: %d planes", ErrDelta, planes)
	}
	d := &xdelta{size: int(size), planes: planes, m: int(size) / planes}
	var (
		lens   [4]int
		total  int
		frames int
	)
	for p := range planes {
		if len(h) < 1 {
			return nil, fmt.Errorf("%w: a truncated sparse delta header", ErrDelta)
		}
		pl := &d.pl[p]
		pl.form = h[0]
		h = h[1:]
		want := d.m
		switch pl.form {
		case formDense:
		case formSparse:
			if len(h) < 4 {
				return nil, fmt.Errorf("%w: a truncated sparse delta header", ErrDelta)
			}
			k := int64(binary.LittleEndian.Uint32(h))
			h = h[4:]
			if k > int64(d.m) {
				return nil, fmt.Errorf("%w: plane %d: %d nonzero bytes in a plane of %d", ErrDelta, p, k, d.m)
			}
			pl.k = int(k) // the count, until decoded
			want = (d.m+7)/8 + int(k)
		default:
			return nil, fmt.Errorf("%w: plane %d of form %d", ErrDelta, p, pl.form)
		}
		if len(h) < 4 {
			return nil, fmt.Errorf("%w: a truncated sparse delta header", ErrDelta)
		}
		lens[p] = int(binary.LittleEndian.Uint32(h))
		h = h[4:]
		frames += lens[p]
		total += want
	}
	tail := int(size) - d.m*planes
	if len(h) < tail || len(h)-tail != frames {
		return nil, fmt.Errorf("%w: a sparse delta of %d bytes whose header says %d", ErrDelta, len(delta), len(delta)-len(h)+tail+frames)
	}
	// The tail first: the decoder may write past the end of a plane into
	// the room after it (the next plane's, decoded after).
	d.buf = getBuf(tail + total + planesSlack)
	buf := *d.buf
	d.tail = buf[:tail]
	copy(d.tail, h[:tail])
	h = h[tail:]
	off := tail
	for p := range planes {
		pl := &d.pl[p]
		want := d.m
		if pl.form == formSparse {
			want = (d.m+7)/8 + pl.k
		}
		sec, err := decodeFrame(h[:lens[p]], buf[off:off:len(buf)], want)
		if err != nil {
			d.release()
			return nil, fmt.Errorf("%w: plane %d: %v", ErrDelta, p, err)
		}
		h = h[lens[p]:]
		off += want
		if pl.form == formDense {
			pl.dense, pl.k = sec, 0
			continue
		}
		nb := (d.m + 7) / 8
		pl.bitmap, pl.vals = sec[:nb], sec[nb:]
		if r := d.m % 8; r != 0 && pl.bitmap[nb-1]>>r != 0 {
			d.release()
			return nil, fmt.Errorf("%w: plane %d: the bitmap marks bytes past the plane's %d", ErrDelta, p, d.m)
		}
		if c := popcount(pl.bitmap); c != pl.k {
			d.release()
			return nil, fmt.Errorf("%w: plane %d: the bitmap marks %d bytes, the header counts %d", ErrDelta, p, c, pl.k)
		}
		pl.k = 0
	}
	return d, nil
}

// decodeFrame decodes the zstd frame f, which must hold exactly want
// bytes, into dst's storage (appended to dst, of room enough). The frame
// must say it holds want bytes, unless want is under 256 (zstd's encoder
// then leaves the size out).
func decodeFrame(f, dst []byte, want int) ([]byte, error) {
	var h zstd.Header
	if err := h.Decode(f); err != nil || (h.HasFCS && h.FrameContentSize != uint64(want)) || (!h.HasFCS && want >= 256) {
		return nil, fmt.Errorf("the frame does not hold %d bytes", want)
	}
	pool := decoderPool(int64(want))
	dec := pool.Get().(*zstd.Decoder)
	defer pool.Put(dec)
	x, err := dec.DecodeAll(f, dst)
	switch {
	case err != nil:
		return nil, err
	case len(x) != want || (want > 0 && &x[0] != &dst[:1][0]):
		return nil, fmt.Errorf("decodes to %d bytes, not %d", len(x), want)
	}
	return x, nil
}
