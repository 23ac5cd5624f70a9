// Package sha2x computes two SHA-256 digests at once. Pair hashes one
// stream of bytes twice in one pass: the whole stream (A) and the part of
// it since B was last reset (a chunk of a file being cut). Pairer hashes
// the streams of goroutines that verify different chunks two at a time.
// On x86-64 with the SHA extensions the two are computed interleaved, two
// independent chains of rounds that the processor overlaps, so both cost
// about what one costs; elsewhere they are two crypto/sha256 hashes.
package sha2x

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"
	"sync/atomic"
)

// Size is the size of a SHA-256 digest in bytes.
const Size = sha256.Size

// Pair is the two digests of a stream: A of all of it, B of the bytes
// since B's last reset. The zero value is not ready; use New.
type Pair struct {
	fast   bool
	a, b   state     // fast
	ha, hb hash.Hash // otherwise
}

// New returns a Pair with both digests empty.
func New() *Pair {
	p := &Pair{fast: useBlock2}
	if p.fast {
		p.a.reset()
		p.b.reset()
	} else {
		p.ha, p.hb = sha256.New(), sha256.New()
	}
	return p
}

// Write adds data to both digests.
func (p *Pair) Write(data []byte) {
	if !p.fast {
		p.ha.Write(data)
		p.hb.Write(data)
		return
	}
	write2(&p.a, &p.b, data, data)
}

// write2 adds pa to a and pb to b, the whole blocks both have interleaved.
func write2(a, b *state, pa, pb []byte) {
	ra, rb := a.fill(pa), b.fill(pb)
	if n := min(len(ra), len(rb)) / blockSize; n > 0 {
		block2(&a.h, &b.h, &ra[0], &rb[0], n)
		ra, rb = ra[n*blockSize:], rb[n*blockSize:]
	}
	a.rest(ra)
	b.rest(rb)
	a.len += uint64(len(pa))
	b.len += uint64(len(pb))
}

// SumA appends the digest of the whole stream to in; the state is kept.
func (p *Pair) SumA(in []byte) []byte {
	if !p.fast {
		return p.ha.Sum(in)
	}
	return p.a.sum(in)
}

// SumB appends the digest of the bytes since B's reset to in; the state
// is kept.
func (p *Pair) SumB(in []byte) []byte {
	if !p.fast {
		return p.hb.Sum(in)
	}
	return p.b.sum(in)
}

// ResetB empties B: the next bytes start a new run.
func (p *Pair) ResetB() {
	if !p.fast {
		p.hb.Reset()
		return
	}
	p.b.reset()
}

const blockSize = 64

// state is one SHA-256 computation: the chaining value, the bytes of an
// unfinished block and the length so far.
type state struct {
	h   [8]uint32
	x   [blockSize]byte
	nx  int
	len uint64
}

func (s *state) reset() {
	s.h = [8]uint32{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}
	s.nx, s.len = 0, 0
}

// fill tops up the unfinished block from data, hashing it when it is
// full, and returns the rest of data.
func (s *state) fill(data []byte) []byte {
	if s.nx == 0 {
		return data
	}
	n := copy(s.x[s.nx:], data)
	s.nx += n
	if s.nx == blockSize {
		s.blocks(s.x[:])
		s.nx = 0
	}
	return data[n:]
}

// rest hashes the whole blocks of data (the unfinished block is empty
// unless data is) and keeps the bytes after them.
func (s *state) rest(data []byte) {
	if n := len(data) / blockSize * blockSize; n > 0 {
		s.blocks(data[:n])
		data = data[n:]
	}
	if len(data) > 0 {
		s.nx += copy(s.x[s.nx:], data)
	}
}

// blocks hashes whole blocks into s alone (the other lane's work is
// thrown away: this is for a block or two at a run's edges).
func (s *state) blocks(data []byte) {
	var scratch [8]uint32
	block2(&s.h, &scratch, &data[0], &data[0], len(data)/blockSize)
}

// sum appends the digest to in without changing s.
func (s *state) sum(in []byte) []byte {
	d := *s
	var pad [blockSize + 8]byte
	pad[0] = 0x80
	n := 1 + (55-int(d.len%blockSize)+blockSize)%blockSize // to 56 mod 64
	binary.BigEndian.PutUint64(pad[n:], d.len<<3)
	d.write(pad[:n+8])
	var out [Size]byte
	for i, v := range d.h {
		binary.BigEndian.PutUint32(out[4*i:], v)
	}
	return append(in, out[:]...)
}

// write adds data to s alone.
func (s *state) write(data []byte) {
	s.rest(s.fill(data))
	s.len += uint64(len(data))
}

// Digest is one SHA-256 computation (a hash.Hash) that a Pairer can run
// beside another goroutine's.
type Digest struct {
	fast bool
	s    state     // fast
	h    hash.Hash // otherwise
}

// NewDigest returns an empty Digest.
func NewDigest() *Digest {
	d := &Digest{fast: useBlock2}
	if d.fast {
		d.s.reset()
	} else {
		d.h = sha256.New()
	}
	return d
}

// Write adds p to the digest.
func (d *Digest) Write(p []byte) (int, error) {
	if !d.fast {
		return d.h.Write(p)
	}
	d.s.write(p)
	return len(p), nil
}

// Sum appends the digest to in; the state is kept.
func (d *Digest) Sum(in []byte) []byte {
	if !d.fast {
		return d.h.Sum(in)
	}
	return d.s.sum(in)
}

// Reset empties the digest.
func (d *Digest) Reset() {
	if !d.fast {
		d.h.Reset()
		return
	}
	d.s.reset()
}

// Size is the digest's size in bytes.
func (d *Digest) Size() int { return Size }

// BlockSize is SHA-256's block size.
func (d *Digest) BlockSize() int { return blockSize }

// Pairer lets goroutines that hash independent streams hash two at a
// time: each offers its next bytes, does other work (writes them out), and
// collects; one that offers while another's offer waits hashes both,
// interleaved. Without the SHA extensions an offer is hashed at once.
type Pairer struct {
	mu      sync.Mutex
	waiting *Offer
	paired  atomic.Int64
}

// Paired returns how many offers were hashed beside another, in pairs.
func (pr *Pairer) Paired() int64 { return pr.paired.Load() }

// Offer is bytes offered to a Pairer, hashed by the time Collect returns.
type Offer struct {
	d    *Digest
	p    []byte
	done chan struct{} // closed once another goroutine hashed it
}

// Offer adds p to d, now together with a waiting offer, or later: p must
// not change, nor d be used, until Collect(the offer returned) returns.
func (pr *Pairer) Offer(d *Digest, p []byte) *Offer {
	if !d.fast {
		d.Write(p)
		return nil
	}
	pr.mu.Lock()
	if w := pr.waiting; w != nil {
		pr.waiting = nil
		pr.mu.Unlock()
		write2(&w.d.s, &d.s, w.p, p)
		pr.paired.Add(1)
		close(w.done)
		return nil
	}
	o := &Offer{d: d, p: p, done: make(chan struct{})}
	pr.waiting = o
	pr.mu.Unlock()
	return o
}

// Collect returns once o (nil: nothing to wait for) is hashed: by now,
// alone, if no other goroutine took it.
func (pr *Pairer) Collect(o *Offer) {
	if o == nil {
		return
	}
	pr.mu.Lock()
	if pr.waiting == o {
		pr.waiting = nil
		pr.mu.Unlock()
		o.d.s.write(o.p)
		return
	}
	pr.mu.Unlock()
	<-o.done
}

// Stream is one stream's hash fed through a Pairer piece by piece: each
// piece is offered, to be hashed beside another stream's, and collected
// when the next piece is written or at Wait.
type Stream struct {
	pr    *Pairer
	h     hash.Hash
	d     *Digest // h, when a Pairer can run it
	offer *Offer
}

// Stream returns a Stream adding to h through pr; on a nil Pairer, or for
// an h that is not a *Digest, pieces are hashed alone as they are written.
func (pr *Pairer) Stream(h hash.Hash) *Stream {
	s := &Stream{pr: pr, h: h}
	if pr != nil {
		s.d, _ = h.(*Digest)
	}
	return s
}

// Write adds p to the hash: p must not change until the next Write or
// Wait returns.
func (s *Stream) Write(p []byte) {
	s.Wait()
	if s.d != nil {
		s.offer = s.pr.Offer(s.d, p)
		return
	}
	s.h.Write(p)
}

// Wait returns once every piece written is hashed; call it before the sum
// is read, and before a written piece's buffer is reused or returned.
func (s *Stream) Wait() {
	if s.offer != nil {
		s.pr.Collect(s.offer)
		s.offer = nil
	}
}
