package sha2x

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"testing"
)

// TestPairMatchesSHA256 feeds random data in random pieces, resetting B at
// random points, and checks both digests against crypto/sha256 at every
// step, with the interleaved rounds and without them.
func TestPairMatchesSHA256(t *testing.T) {
	for _, fast := range []bool{true, false} {
		if fast && !useBlock2 {
			t.Log("no SHA extensions here: only the fallback is checked")
			continue
		}
		rng := rand.New(rand.NewPCG(1, 2))
		data := make([]byte, 1<<20)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		for round := range 200 {
			p := New()
			if !fast {
				p = newSlow()
			}
			pos, bStart := 0, 0
			for pos < len(data) {
				n := rng.IntN(300)
				if rng.IntN(4) == 0 {
					n = rng.IntN(20000)
				}
				n = min(n, len(data)-pos)
				p.Write(data[pos : pos+n])
				pos += n
				if want := sha256.Sum256(data[bStart:pos]); !bytes.Equal(p.SumB(nil), want[:]) {
					t.Fatalf("fast=%v round %d: B of [%d,%d) differs", fast, round, bStart, pos)
				}
				if rng.IntN(8) == 0 {
					p.ResetB()
					bStart = pos
				}
				if round%20 == 0 || pos == len(data) {
					if want := sha256.Sum256(data[:pos]); !bytes.Equal(p.SumA(nil), want[:]) {
						t.Fatalf("fast=%v round %d: A of [0,%d) differs", fast, round, pos)
					}
				}
			}
		}
	}
}

// TestPairLengths checks both digests of every length up to three blocks
// written at once, the padding's edge cases.
func TestPairLengths(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyz"), 10)
	for n := range 3*blockSize + 2 {
		for _, skip := range []int{0, 1, 63} {
			p := New()
			p.Write(data[:skip])
			p.ResetB()
			p.Write(data[skip : skip+n])
			wa, wb := sha256.Sum256(data[:skip+n]), sha256.Sum256(data[skip:skip+n])
			if !bytes.Equal(p.SumA(nil), wa[:]) || !bytes.Equal(p.SumB(nil), wb[:]) {
				t.Fatalf("length %d after %d: digests differ", n, skip)
			}
		}
	}
}

func newSlow() *Pair { return &Pair{ha: sha256.New(), hb: sha256.New()} }

func BenchmarkPair(b *testing.B) {
	data := make([]byte, 1<<20)
	p := New()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		p.Write(data[:1000])
		p.ResetB()
		p.Write(data[1000:])
	}
}

func BenchmarkTwoSHA256(b *testing.B) {
	data := make([]byte, 1<<20)
	p := newSlow()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		p.Write(data[:1000])
		p.ResetB()
		p.Write(data[1000:])
	}
}
