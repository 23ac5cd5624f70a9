package layout

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/bits"
)

// Params are the content-defined chunking parameters of a volume, in bytes.
// They are recorded in the index so later pushes of the volume reuse them.
type Params struct {
	Min int64 `json:"min"`
	Avg int64 `json:"avg"`
	Max int64 `json:"max"`
	// Pack is the average size of the packs small files (under Min) are
	// packed into, between Pack/2 and 2×Pack; zero packs them with Min, Avg
	// and Max (format version 1).
	Pack int64 `json:"pack,omitempty"`
}

// DefaultParams are MiB-sized: registries cost 5–50 ms and several ms of
// CPU per blob request, so fewer, larger chunks move data faster.
// Small files go in packs of about 512 KiB, so that one changed small file
// re-uploads well under a MiB.
var DefaultParams = Params{Min: 1 << 20, Avg: 8 << 20, Max: 16 << 20, Pack: DefaultPack}

// DefaultPack is the average pack size of small files a push chooses.
const DefaultPack = 512 << 10

// MinInheritedParams are the floor of the chunking parameters a push takes
// over from an earlier version: a version cut into 64-byte chunks must not
// make every later push upload one blob per 64 bytes.
var MinInheritedParams = Params{Min: 4 << 10, Avg: 8 << 10, Max: 16 << 10}

// Inherited returns p raised to MinInheritedParams (keeping min <= avg <=
// max), for a push that takes over an earlier version's parameters.
func (p Params) Inherited() Params {
	f := MinInheritedParams
	p.Min = max(p.Min, f.Min)
	p.Avg = max(p.Avg, f.Avg, p.Min)
	p.Max = max(p.Max, f.Max, p.Avg)
	if p.Pack != 0 {
		p.Pack = max(p.Pack, f.Min)
	}
	return p
}

// Completed fills the sizes p leaves zero from the ones it gives and
// DefaultParams, and validates the result. All zero stays all zero: the
// caller chooses the parameters then.
func (p Params) Completed() (Params, error) {
	if p == (Params{}) {
		return p, nil
	}
	d := DefaultParams
	if p.Min == 0 {
		p.Min = min(d.Min, p.Avg/4)
	}
	if p.Avg == 0 {
		p.Avg = max(p.Min, min(d.Avg, p.Max/2))
	}
	if p.Max == 0 {
		p.Max = max(p.Avg*2, d.Max)
	}
	return p, p.Validate()
}

// Validate reports whether the parameters are usable.
func (p Params) Validate() error {
	if p.Min < 64 || p.Avg < p.Min || p.Max < p.Avg || p.Max > MaxChunkBytes {
		return fmt.Errorf("chunk sizes must satisfy 64 <= min <= avg <= max <= %d, got min=%d avg=%d max=%d", MaxChunkBytes, p.Min, p.Avg, p.Max)
	}
	if p.Pack != 0 && (p.Pack < 64 || p.Pack > MaxChunkBytes/2) {
		return fmt.Errorf("pack size must be 0 or 64 … %d, got %d", MaxChunkBytes/2, p.Pack)
	}
	return nil
}

// PackParams returns the sizes small files are packed with.
func (p Params) PackParams() Params {
	if p.Pack == 0 {
		return Params{Min: p.Min, Avg: p.Avg, Max: p.Max}
	}
	return Params{Min: p.Pack / 2, Avg: p.Pack, Max: 2 * p.Pack}
}

// gear is the rolling-hash table: gear[i] is the first 8 bytes (big endian)
// of SHA-256("bdnvol-gear" || byte(i)). docs/format.md documents it so other
// tools cut at the same places.
var gear = func() (t [256]uint64) {
	for i := range t {
		h := sha256.Sum256(append([]byte("bdnvol-gear"), byte(i)))
		t[i] = binary.BigEndian.Uint64(h[:8])
	}
	return t
}()

// Cutter finds FastCDC cut points (normalised, level 1) in a byte stream.
// It keeps only the rolling hash and the length of the current chunk.
type Cutter struct {
	p            Params
	maskS, maskL uint64
	hash         uint64
	n            int64 // bytes in the current chunk so far
}

// NewCutter returns a Cutter for the chunking parameters p.
func NewCutter(p Params) *Cutter {
	b := bits.Len64(uint64(p.Avg)) - 1 // log2(avg)
	top := func(k int) uint64 {
		if k < 1 {
			k = 1
		}
		if k > 63 {
			k = 63
		}
		return ^uint64(0) << (64 - k)
	}
	return &Cutter{p: p, maskS: top(b + 1), maskL: top(b - 1)}
}

// Reset starts a new chunk.
func (c *Cutter) Reset() { c.hash, c.n = 0, 0 }

// Next returns how many bytes of buf belong to the current chunk and whether
// the chunk ends after them. When end is true the Cutter is reset.
func (c *Cutter) Next(buf []byte) (int, bool) {
	i := 0
	// Skip to the minimum size; the hash window (64 bytes) fills before it matters.
	if c.n < c.p.Min-64 {
		skip := c.p.Min - 64 - c.n
		if int64(len(buf)) <= skip {
			c.n += int64(len(buf))
			return len(buf), false
		}
		i = int(skip)
		c.n += skip
	}
	h := c.hash
	n := c.n
	for ; i < len(buf); i++ {
		h = h<<1 + gear[buf[i]]
		n++
		if n < c.p.Min {
			continue
		}
		if n < c.p.Avg {
			if h&c.maskS == 0 {
				c.Reset()
				return i + 1, true
			}
		} else if h&c.maskL == 0 || n >= c.p.Max {
			c.Reset()
			return i + 1, true
		}
	}
	c.hash, c.n = h, n
	return len(buf), false
}
