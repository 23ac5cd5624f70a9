package sha2x

import (
	"bytes"
	"crypto/sha256"
	"hash"
	"math/rand/v2"
	"sync"
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

// TestPairerMatchesSHA256 hashes streams on several goroutines through one
// Pairer, each offering its pieces and collecting them, and checks every
// digest against crypto/sha256.
func TestPairerMatchesSHA256(t *testing.T) {
	var pr Pairer
	var wg sync.WaitGroup
	paired := 0
	var mu sync.Mutex
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for range 20 {
				data := make([]byte, rng.IntN(200000))
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
				d := NewDigest()
				buf := make([]byte, 70000)
				for off := 0; off < len(data); {
					n := copy(buf[:1+rng.IntN(len(buf)-1)], data[off:])
					o := pr.Offer(d, buf[:n])
					other := bytes.Clone(buf[:n]) // work between, as a write
					_ = other
					if o == nil {
						mu.Lock()
						paired++
						mu.Unlock()
					}
					pr.Collect(o)
					off += n
				}
				if want := sha256.Sum256(data); !bytes.Equal(d.Sum(nil), want[:]) {
					t.Errorf("goroutine %d: digest of %d bytes differs", g, len(data))
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d offers hashed at once", paired)
}

// TestPairerPairs: an offer waiting when another goroutine offers is
// hashed by that goroutine, with its own bytes, both digests right.
func TestPairerPairs(t *testing.T) {
	if !useBlock2 {
		t.Skip("no SHA extensions: offers are hashed at once")
	}
	var pr Pairer
	a, b := bytes.Repeat([]byte("a"), 100000), bytes.Repeat([]byte("bc"), 70001)
	da, db := NewDigest(), NewDigest()
	o := pr.Offer(da, a)
	if o == nil {
		t.Fatal("the first offer was not left waiting")
	}
	done := make(chan *Offer)
	go func() { done <- pr.Offer(db, b) }()
	if ob := <-done; ob != nil {
		t.Fatal("the second offer did not take the waiting one")
	}
	pr.Collect(o)
	wa, wb := sha256.Sum256(a), sha256.Sum256(b)
	if !bytes.Equal(da.Sum(nil), wa[:]) || !bytes.Equal(db.Sum(nil), wb[:]) {
		t.Fatal("paired digests differ")
	}
}

// TestStreamMatchesSHA256 hashes streams on several goroutines through
// Streams of one Pairer, each reading into two buffers in turn as the
// callers do, and checks every digest against crypto/sha256; so do a
// Stream of a nil Pairer and one over a hash that is not a Digest. Then
// two streams whose pieces meet are hashed side by side (how often the
// goroutines' pieces meet is the scheduler's: on a loaded machine they
// may never).
func TestStreamMatchesSHA256(t *testing.T) {
	var pr Pairer
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			for i := range 20 {
				data := make([]byte, rng.IntN(300000))
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
				var h hash.Hash = NewDigest()
				p := &pr
				switch i % 5 {
				case 3:
					p = nil
				case 4:
					h = sha256.New()
				}
				hs := p.Stream(h)
				var halves [2][40000]byte
				for off, k := 0, 0; off < len(data); k ^= 1 {
					n := copy(halves[k][:1+rng.IntN(len(halves[k])-1)], data[off:])
					hs.Write(halves[k][:n])
					off += n
				}
				hs.Wait()
				if want := sha256.Sum256(data); !bytes.Equal(h.Sum(nil), want[:]) {
					t.Errorf("goroutine %d, stream %d: digest of %d bytes differs", g, i, len(data))
					return
				}
			}
		}()
	}
	wg.Wait()

	// Two streams whose pieces meet (one written while the other's waits)
	// are hashed side by side, whatever the scheduler did above.
	if useBlock2 {
		before := pr.Paired()
		pa, pb := bytes.Repeat([]byte("x"), 70000), bytes.Repeat([]byte("yz"), 50000)
		da, db := NewDigest(), NewDigest()
		sa, sb := pr.Stream(da), pr.Stream(db)
		sa.Write(pa)
		sb.Write(pb)
		sa.Wait()
		sb.Wait()
		wa, wb := sha256.Sum256(pa), sha256.Sum256(pb)
		if !bytes.Equal(da.Sum(nil), wa[:]) || !bytes.Equal(db.Sum(nil), wb[:]) {
			t.Error("the digests of two streams hashed side by side differ")
		}
		if pr.Paired() == before {
			t.Error("a piece written while another stream's waited was not hashed beside it")
		}
	}
}

// FuzzSHA2x checks the interleaved rounds against crypto/sha256 on the
// fuzzer's bytes: a Pair over a with B reset at cut, and two Digests of
// different streams (a and b, from different offsets of their blocks)
// hashed together by a Pairer.
func FuzzSHA2x(f *testing.F) {
	f.Add([]byte("abc"), []byte(""), uint16(1), uint16(0))
	f.Add(bytes.Repeat([]byte{7}, 300), bytes.Repeat([]byte{9}, 1000), uint16(64), uint16(5))
	f.Fuzz(func(t *testing.T, a, b []byte, cut, skew uint16) {
		c := int(cut) % (len(a) + 1)
		p := New()
		p.Write(a[:c])
		p.ResetB()
		p.Write(a[c:])
		wa, wb := sha256.Sum256(a), sha256.Sum256(a[c:])
		if !bytes.Equal(p.SumA(nil), wa[:]) || !bytes.Equal(p.SumB(nil), wb[:]) {
			t.Fatalf("Pair of %d bytes cut at %d: digests differ", len(a), c)
		}
		// b starts skew bytes in, so the two streams' blocks do not line up.
		s := int(skew) % (len(b) + 1)
		var pr Pairer
		da, db := NewDigest(), NewDigest()
		db.Write(b[:s])
		o := pr.Offer(da, a)
		if o2 := pr.Offer(db, b[s:]); o2 != nil {
			pr.Collect(o2)
		}
		pr.Collect(o)
		wb = sha256.Sum256(b)
		if !bytes.Equal(da.Sum(nil), wa[:]) || !bytes.Equal(db.Sum(nil), wb[:]) {
			t.Fatalf("paired digests of %d and %d bytes (skew %d) differ", len(a), len(b), s)
		}
	})
}
