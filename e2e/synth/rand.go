package synth

import (
	"encoding/binary"
	"hash/fnv"
	"math"
)

// rng is a xorshift64* generator: cheap, good enough statistically for
// producing weight-like bytes, and fully deterministic.
type rng struct{ s uint64 }

func newRNG(seed uint64, parts ...string) *rng {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	s := splitmix(h.Sum64())
	if s == 0 {
		s = 0x9e3779b97f4a7c15
	}
	return &rng{s: s}
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (r *rng) next() uint64 {
	x := r.s
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	r.s = x
	return x * 0x2545f4914f6cdd1d
}

// float64 returns a value in [0,1).
func (r *rng) float64() float64 {
	return float64(r.next()>>11) / (1 << 53)
}

// intn returns a value in [0,n).
func (r *rng) intn(n int) int {
	return int(r.next() % uint64(n))
}

// valueTable maps 16 random bits to a bf16 value. Entry k is the bf16
// truncation of scale*Φ⁻¹((k+0.5)/65536) + offset, so indexing it with
// uniform random bits yields (a finely discretised) normal distribution.
type valueTable [1 << 16]uint16

var (
	// weightTable: N(0, 0.02²), the usual initialiser scale for linear layers.
	weightTable = buildTable(0.02, 0)
	// normTable: layer norm weights, close to 1.
	normTable = buildTable(0.05, 1)
)

func buildTable(scale, offset float64) *valueTable {
	var t valueTable
	for k := range t {
		p := (float64(k) + 0.5) / float64(len(t))
		v := float32(offset + scale*math.Sqrt2*math.Erfinv(2*p-1))
		t[k] = uint16(math.Float32bits(v) >> 16) // truncate to bf16
	}
	return &t
}

// fill writes len(p) bytes of bf16 values drawn from t. len(p) need not be a
// multiple of 8, but it is always even for bf16 tensors.
func (r *rng) fill(p []byte, t *valueTable) {
	s := r.s
	n := len(p) &^ 7
	for i := 0; i < n; i += 8 {
		s ^= s >> 12
		s ^= s << 25
		s ^= s >> 27
		x := s * 0x2545f4914f6cdd1d
		v := uint64(t[x&0xffff]) |
			uint64(t[(x>>16)&0xffff])<<16 |
			uint64(t[(x>>32)&0xffff])<<32 |
			uint64(t[x>>48])<<48
		binary.LittleEndian.PutUint64(p[i:], v)
	}
	r.s = s
	if n < len(p) {
		x := r.next()
		for i := n; i+1 < len(p); i += 2 {
			binary.LittleEndian.PutUint16(p[i:], t[x&0xffff])
			x >>= 16
		}
		if len(p)%2 == 1 {
			p[len(p)-1] = byte(x)
		}
	}
}
