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
// bitmap of the plane's nonzero bytes, itself stored as a bitmap of its
// nonzero bytes and those bytes, then the plane's nonzero bytes). The XOR
// of a small training step is mostly zero bytes: zstd decodes the sparse
// form, a few hundredths of the plane and hardly any zero runs, several
// times faster than it rebuilds the long runs of zeros of the dense one,
// and the reader XORs in only the bytes the bitmap marks.

// sparseMagic starts a delta blob of the sparse encoding.
var sparseMagic = [4]byte{'B', 'D', 'X', '2'}

// Forms of a plane in a sparse delta blob.
const (
	formDense  = 0 // the plane's bytes
	formSparse = 1 // sparseForm's
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
		count  [4]int // nonzero bytes of the plane
		marks  [4]int // nonzero bytes of its bitmap
		frames [4][]byte
		sparse bool
	)
	for p := range planes {
		pl := x[p*m : (p+1)*m]
		k := nonzero(pl)
		sp, marked := sparseForm(pl, k)
		frames[p] = enc.EncodeAll(sp, nil)
		form[p], count[p], marks[p] = formSparse, k, marked
		if float64(k) > sparseMaxDensity*float64(m) {
			if d := enc.EncodeAll(pl, nil); len(d) < len(frames[p]) {
				frames[p], form[p] = d, formDense
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
			size += 8
		}
	}
	out := make([]byte, 0, size)
	out = append(out, sparseMagic[:]...)
	out = append(out, byte(planes))
	for p := range planes {
		out = append(out, form[p])
		if form[p] == formSparse {
			out = binary.LittleEndian.AppendUint32(out, uint32(marks[p]))
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
// bytes, and the number of nonzero bytes of its bitmap, marked. The bitmap
// B of the plane has ⌈len(pl)/8⌉ bytes (bit i mod 8 of byte i/8 set when
// byte i of pl is not zero); the form is the bitmap of B's nonzero bytes
// (⌈len(B)/8⌉ bytes, the same way), B's nonzero bytes (marked of them),
// then pl's nonzero bytes (k), each in order.
func sparseForm(pl []byte, k int) (out []byte, marked int) {
	nb := (len(pl) + 7) / 8
	b := make([]byte, nb)
	for i := 0; i < len(pl); i += 8 {
		var w uint64
		if i+8 <= len(pl) {
			w = binary.LittleEndian.Uint64(pl[i:])
		} else {
			for e, c := range pl[i:] {
				w |= uint64(c) << (8 * e)
			}
		}
		if w == 0 {
			continue
		}
		var c byte
		for e := range 8 {
			if byte(w>>(8*e)) != 0 {
				c |= 1 << e
			}
		}
		b[i/8] = c
		marked++
	}
	n1 := (nb + 7) / 8
	out = make([]byte, n1+marked+k)
	l1, l0, vals := out[:n1], out[n1:n1], out[n1+marked:n1+marked]
	for j, c := range b {
		if c != 0 {
			l1[j/8] |= 1 << (j % 8)
			l0 = append(l0, c)
		}
	}
	for _, c := range pl {
		if c != 0 {
			vals = append(vals, c)
		}
	}
	return out, marked
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
	marks  []byte // formSparse: which bytes of the bitmap are nonzero
	bitmap []byte // formSparse: the nonzero bytes of the bitmap
	vals   []byte // formSparse: the nonzero bytes
	c, k   int    // bitmap bytes and values before element next
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

// xorRange XORs elements lo to hi of the delta into dst, of size bytes, as
// xorPlanesRange (lo a multiple of 8, hi too unless it is m, when the bytes
// past the last whole element go too). Ranges taken in order cost only
// their elements; another costs a count of the bitmaps up to lo.
func (d *xdelta) xorRange(dst []byte, lo, hi int) {
	end := hi * d.planes
	if hi == d.m {
		end = d.size
	}
	d.xorWindow(dst[lo*d.planes:end], lo, hi)
}

// xorWindow is xorRange into win, which holds only the bytes of elements
// lo to hi of the chunk (win[0] is byte 0 of element lo), and the bytes
// past the last whole element when hi is m: a piece of the chunk read
// apart from the rest.
func (d *xdelta) xorWindow(win []byte, lo, hi int) {
	if d.flat != nil {
		xorPlanesWindow(win, d.flat, d.planes, lo, hi)
		return
	}
	if lo != d.next {
		for p := range d.planes {
			if pl := &d.pl[p]; pl.form == formSparse {
				pl.c = popcountBits(pl.marks, lo/8)
				pl.k = popcount(pl.bitmap[:pl.c])
			}
		}
	}
	for p := range d.planes {
		pl := &d.pl[p]
		if pl.form == formDense {
			xorDense(win, pl.dense, d.planes, p, lo, hi)
		} else {
			pl.c, pl.k = scatter(win, pl, d.planes, p, lo, hi)
		}
	}
	d.next = hi
	if hi == d.m {
		end := (d.m - lo) * d.planes
		for j, c := range d.tail {
			win[end+j] ^= c
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

// popcountBits counts the set bits among the first n bits of b.
func popcountBits(b []byte, n int) int {
	k := popcount(b[:n/8])
	if r := n % 8; r != 0 {
		k += bits.OnesCount8(b[n/8] & (1<<r - 1))
	}
	return k
}

// scatter XORs the nonzero bytes of the sparse plane pl (byte p of every
// element of planes bytes) into the elements lo to hi that its bitmap
// marks, held by win (win[0] is byte 0 of element lo), from its bitmap byte pl.c and value pl.k on, and returns
// where they are after hi. It goes 64 bitmap bytes (512 elements) a word
// of marks, a word without a mark skipped.
func scatter(win []byte, pl *xplane, planes, p, lo, hi int) (int, int) {
	marks, bitmap, vals, c, k := pl.marks, pl.bitmap, pl.vals, pl.c, pl.k
	jlo, jhi := lo/8, (hi+7)/8 // the bitmap bytes of the elements
	for w := jlo &^ 63; w < jhi; w += 64 {
		b := marks[w/8:]
		var v uint64
		if len(b) >= 8 {
			v = binary.LittleEndian.Uint64(b)
		} else {
			for i, x := range b {
				v |= uint64(x) << (8 * i)
			}
		}
		if w < jlo {
			v &^= 1<<(jlo-w) - 1
		}
		if n := jhi - w; n < 64 {
			v &= 1<<n - 1
		}
		for v != 0 {
			e := (w+bits.TrailingZeros64(v))*8 - lo
			for m := bitmap[c]; m != 0; m &= m - 1 {
				win[(e+bits.TrailingZeros8(m))*planes+p] ^= vals[k]
				k++
			}
			c++
			v &= v - 1
		}
	}
	return c, k
}

// xorDense XORs elements lo to hi of the dense plane pl, byte p of every
// element of planes bytes, into win, which holds those elements (win[0] is
// byte 0 of element lo), 8 elements at a time, a group of zeros skipped.
func xorDense(win, pl []byte, planes, p, lo, hi int) {
	i := lo
	switch planes {
	case PlanesRaw:
		for ; i+8 <= hi; i += 8 {
			if w := binary.LittleEndian.Uint64(pl[i:]); w != 0 {
				d := win[i-lo : i-lo+8]
				binary.LittleEndian.PutUint64(d, w^binary.LittleEndian.Uint64(d))
			}
		}
	case Planes16:
		for ; i+8 <= hi; i += 8 {
			a := binary.LittleEndian.Uint64(pl[i:])
			if a == 0 {
				continue
			}
			d := win[2*(i-lo) : 2*(i-lo)+16]
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
			d := win[planes*(i-lo) : planes*(i-lo+8)]
			for e := range 8 {
				d[planes*e+p] ^= byte(a >> (8 * e))
			}
		}
	}
	for ; i < hi; i++ {
		win[(i-lo)*planes+p] ^= pl[i]
	}
}

// decodeSparse decodes the "BDX2" blob delta of a chunk of size bytes
// (its magic checked) into a pooled buffer. It decodes at most the bytes
// the header promises (at most 1.15 times size: a plane, its bitmap and
// the bitmap's marks): a header that does not add up, a frame that holds
// more or fewer bytes than its plane, a bitmap that marks another number
// of bytes than its count, are refused with ErrDelta.
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
			if len(h) < 8 {
				return nil, fmt.Errorf("%w: a truncated sparse delta header", ErrDelta)
			}
			c, k := int64(binary.LittleEndian.Uint32(h)), int64(binary.LittleEndian.Uint32(h[4:]))
			h = h[8:]
			if k > int64(d.m) || c > k || k > 8*c {
				return nil, fmt.Errorf("%w: plane %d: %d nonzero bytes, %d of its bitmap, in a plane of %d", ErrDelta, p, k, c, d.m)
			}
			pl.c, pl.k = int(c), int(k) // the counts, until decoded
			want = sparseLen(d.m) + int(c) + int(k)
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
			want = sparseLen(d.m) + pl.c + pl.k
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
		n1 := sparseLen(d.m)
		pl.marks, pl.bitmap, pl.vals = sec[:n1], sec[n1:n1+pl.c], sec[n1+pl.c:]
		if err := pl.check(d.m); err != nil {
			d.release()
			return nil, fmt.Errorf("%w: plane %d: %v", ErrDelta, p, err)
		}
		pl.c, pl.k = 0, 0
	}
	return d, nil
}

// sparseLen is the length of the marks of the bitmap of a plane of m
// bytes: one bit per byte of the bitmap, one bit of which per byte of the
// plane.
func sparseLen(m int) int { return ((m+7)/8 + 7) / 8 }

// check checks the decoded sparse plane pl, of m bytes (pl.c and pl.k the
// counts its header gives): the marks mark pl.c bytes of the bitmap, none
// past its end; no marked byte is zero; the bitmap marks pl.k bytes, none
// past the plane's end.
func (pl *xplane) check(m int) error {
	nb := (m + 7) / 8
	if r := nb % 8; r != 0 && pl.marks[len(pl.marks)-1]>>r != 0 {
		return fmt.Errorf("the marks go past the bitmap's %d bytes", nb)
	}
	if c := popcount(pl.marks); c != pl.c {
		return fmt.Errorf("%d bitmap bytes marked, the header counts %d", c, pl.c)
	}
	k := 0
	for _, b := range pl.bitmap {
		if b == 0 {
			return fmt.Errorf("a marked bitmap byte is zero")
		}
		k += bits.OnesCount8(b)
	}
	if k != pl.k {
		return fmt.Errorf("the bitmap marks %d bytes, the header counts %d", k, pl.k)
	}
	// The last byte of the bitmap, when marked, is the last marked one.
	if r := m % 8; r != 0 && nb > 0 && pl.marks[(nb-1)/8]&(1<<((nb-1)%8)) != 0 && pl.bitmap[len(pl.bitmap)-1]>>r != 0 {
		return fmt.Errorf("the bitmap marks bytes past the plane's %d", m)
	}
	return nil
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
