package layout

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// sparseForms returns the forms of the planes of the "BDX2" blob b.
func sparseForms(t *testing.T, b []byte) []byte {
	t.Helper()
	if DeltaFormat(b) != FormatVersion4 {
		t.Fatalf("not a sparse delta: %q", b[:4])
	}
	planes := int(b[4])
	h, forms := b[5:], []byte{}
	for range planes {
		forms = append(forms, h[0])
		h = h[5:]
		if forms[len(forms)-1] == formSparse {
			h = h[8:]
		}
	}
	return forms
}

// TestSparseDeltaRoundTrip: the encoder picks per plane the smaller form
// (an RL step: every plane sparse, smaller than the "BDX1" blob; a full
// fine-tune: the mantissa plane dense, the exponent plane sparse, no
// larger than the "BDX1" blob; unrelated bytes: a "BDX1" blob), and every
// blob decodes to the chunk, whatever its length.
func TestSparseDeltaRoundTrip(t *testing.T) {
	rlBase, rlNext := bf16Step(1<<20, 0.02, 11)
	ftBase, ftNext := bf16Tune(1<<20, 0.01, 12)
	r := rand.New(rand.NewPCG(13, 1))
	other := make([]byte, 1<<20)
	for i := range other {
		other[i] = byte(r.Uint32())
	}
	for _, c := range []struct {
		name        string
		base, next  []byte
		planes      int
		forms       string // "" for a BDX1 blob
		notLargerBy float64
	}{
		{"rl", rlBase, rlNext, Planes16, "\x01\x01", 1},
		{"finetune", ftBase, ftNext, Planes16, "\x00\x01", 1},
		{"rl raw", rlBase, rlNext, PlanesRaw, "\x01", 1},
		{"rl fp32 planes", rlBase, rlNext, Planes32, "\x01\x01\x01\x01", 1},
		{"unrelated", rlBase, other, Planes16, "", 1},
		{"same", rlBase, rlBase, Planes16, "\x01\x01", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := mustDelta(t, c.next, c.base, c.planes)
			dense, err := encodeDelta(c.next, c.base, c.planes, false)
			if err != nil {
				t.Fatal(err)
			}
			if c.forms == "" {
				if DeltaFormat(d) != FormatVersion3 || !bytes.Equal(d, dense) {
					t.Fatalf("want the BDX1 blob, got %q", d[:4])
				}
			} else if got := string(sparseForms(t, d)); got != c.forms {
				t.Fatalf("forms %q, want %q", got, c.forms)
			}
			if len(d) > len(dense) {
				t.Errorf("delta of %d bytes, the BDX1 blob has %d", len(d), len(dense))
			}
			t.Logf("%s: %d bytes (BDX1: %d)", c.name, len(d), len(dense))
			for _, n := range []int{len(c.next), 1001, 4099, 65536 + 3} {
				d := mustDelta(t, c.next[:n], c.base[:n], c.planes)
				got, err := DecodeDelta(d, c.base[:n], int64(n))
				if err != nil || !bytes.Equal(got, c.next[:n]) {
					t.Fatalf("%d bytes: %v, equal %v", n, err, bytes.Equal(got, c.next[:n]))
				}
			}
		})
	}
}

// TestSparseXorRangeAnyOrder: ranges of a decoded sparse delta XORed in
// any order, some twice, give what one pass gives.
func TestSparseXorRangeAnyOrder(t *testing.T) {
	base, next := bf16Step(1<<20+6, 0.05, 14)
	d := mustDelta(t, next, base, Planes32)
	xd, err := decodeX(d, int64(len(next)), true)
	if err != nil {
		t.Fatal(err)
	}
	defer xd.release()
	got := bytes.Clone(base)
	m := len(got) / Planes32
	r := rand.New(rand.NewPCG(15, 1))
	var cuts []int
	for lo := 0; lo < m; {
		hi := min(m, lo+8*(1+r.IntN(5000)))
		cuts = append(cuts, lo)
		lo = hi
	}
	cuts = append(cuts, m)
	order := r.Perm(len(cuts) - 1)
	for _, i := range order {
		xd.xorRange(got, cuts[i], cuts[i+1])
	}
	xd.xorRange(got, cuts[order[0]], cuts[order[0]+1]) // twice: undone
	xd.xorRange(got, cuts[order[0]], cuts[order[0]+1]) // and done again
	if !bytes.Equal(got, next) {
		t.Fatal("ranges in any order do not decode the chunk")
	}
	xd.xorAll(got)
	if !bytes.Equal(got, base) {
		t.Fatal("a second pass does not give the base back")
	}
}

// sparseBlob assembles a "BDX2" blob by hand: planes, per plane its form,
// its counts (sparse: of bitmap bytes and of values) and its decoded
// section, and the tail.
func sparseBlob(t *testing.T, planes int, forms []byte, counts [][2]uint32, secs [][]byte, tail []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	out := append([]byte("BDX2"), byte(planes))
	var frames []byte
	for p := range planes {
		out = append(out, forms[p])
		if forms[p] == formSparse {
			out = binary.LittleEndian.AppendUint32(out, counts[p][0])
			out = binary.LittleEndian.AppendUint32(out, counts[p][1])
		}
		f := enc.EncodeAll(secs[p], nil)
		out = binary.LittleEndian.AppendUint32(out, uint32(len(f)))
		frames = append(frames, f...)
	}
	return append(append(out, tail...), frames...)
}

// TestSparseDeltaHostile: a sparse delta whose header is truncated or
// does not add up, whose frames hold other sizes than their planes, whose
// bitmaps mark another number of bytes than the header counts, mark bytes
// past their plane, or mark a zero byte, is refused with ErrDelta, and so
// is a sparse delta where format 3 is read; a right hand-made one decodes.
func TestSparseDeltaHostile(t *testing.T) {
	const size = 4096 + 2 // two planes of 2049 and no tail
	base := make([]byte, size)
	m := size / 2 // 2049: a bitmap of 257 bytes, its marks 33
	n1 := sparseLen(m)
	// Plane 0: elements 0, 7 and 82 are 1, 2, 3: bitmap bytes 0 (0x81) and
	// 10 (0x04), marked by bit 0 of marks byte 0 and bit 2 of byte 1.
	sec := func(marks map[int]byte, bitmap, vals []byte) []byte {
		b := make([]byte, n1)
		for i, v := range marks {
			b[i] = v
		}
		return append(append(b, bitmap...), vals...)
	}
	right := map[int]byte{0: 0x01, 1: 0x04}
	dense := make([]byte, m)
	dense[5] = 9
	blob := func(c, k uint32, s []byte, d []byte) []byte {
		return sparseBlob(t, 2, []byte{formSparse, formDense}, [][2]uint32{{c, k}, {}}, [][]byte{s, d}, nil)
	}
	g := blob(2, 3, sec(right, []byte{0x81, 0x04}, []byte{1, 2, 3}), dense)
	want := make([]byte, size)
	want[0], want[14], want[164], want[11] = 1, 2, 3, 9
	if got, err := DecodeDelta(g, base, size); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a right sparse delta: %v", err)
	}
	bad := map[string][]byte{}
	for _, n := range []int{4, 5, 6, 9, 13, 17, 18, 22, 26, len(g) - 1} {
		bad[fmt.Sprintf("truncated to %d bytes", n)] = g[:n]
	}
	bad["trailing bytes"] = append(bytes.Clone(g), 0)
	bad["a count past the plane"] = blob(2, uint32(m+1), sec(right, []byte{0x81, 0x04}, make([]byte, m+1)), dense)
	bad["more values than bitmap bytes can mark"] = blob(2, 17, sec(right, []byte{0x81, 0x04}, make([]byte, 17)), dense)
	bad["a value count the bitmap does not mark"] = blob(2, 4, sec(right, []byte{0x81, 0x04}, []byte{1, 2, 3, 4}), dense)
	bad["a bitmap byte count the marks do not mark"] = blob(3, 3, sec(right, []byte{0x81, 0x04, 0x01}, []byte{1, 2, 3}), dense)
	bad["a marked bitmap byte that is zero"] = blob(3, 3, sec(map[int]byte{0: 0x01, 1: 0x0c}, []byte{0x81, 0x04, 0}, []byte{1, 2, 3}), dense)
	bad["marks past the bitmap"] = blob(3, 4, sec(map[int]byte{0: 0x01, 1: 0x04, 32: 0x02}, []byte{0x81, 0x04, 0x01}, []byte{1, 2, 3, 4}), dense)
	bad["a bitmap marking bytes past the plane"] = blob(3, 4, sec(map[int]byte{0: 0x01, 1: 0x04, 32: 0x01}, []byte{0x81, 0x04, 0x02}, []byte{1, 2, 3, 4}), dense)
	bad["a frame of fewer bytes than its plane"] = blob(2, 3, sec(right, []byte{0x81, 0x04}, []byte{1, 2, 3}), dense[:m-1])
	bad["a frame of more bytes than its plane"] = blob(2, 3, sec(right, []byte{0x81, 0x04}, []byte{1, 2, 3}), append(bytes.Clone(dense), 0))
	bad["a sparse frame of more bytes than its counts"] = blob(2, 3, sec(right, []byte{0x81, 0x04}, []byte{1, 2, 3, 4}), dense)
	bad["an unknown form"] = sparseBlob(t, 2, []byte{formSparse, 7}, [][2]uint32{{2, 3}, {}}, [][]byte{sec(right, []byte{0x81, 0x04}, []byte{1, 2, 3}), dense}, nil)
	bad["3 planes"] = sparseBlob(t, 3, []byte{formDense, formDense, formDense}, nil, [][]byte{dense, dense, dense}, nil)
	huge := bytes.Clone(g)
	binary.LittleEndian.PutUint32(huge[14:], 1<<31) // the frame length of plane 0
	bad["a frame longer than the blob"] = huge
	for name, b := range bad {
		if out, err := DecodeDelta(b, base, size); !errors.Is(err, ErrDelta) || out != nil {
			t.Errorf("%s: got %v", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	// The last bitmap byte, marked, may hold element 2048, the plane's
	// last: that one decodes.
	last := blob(3, 4, sec(map[int]byte{0: 0x01, 1: 0x04, 32: 0x01}, []byte{0x81, 0x04, 0x01}, []byte{1, 2, 3, 4}), dense)
	want[2*2048] = 4
	if got, err := DecodeDelta(last, base, size); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the plane's last byte: %v", err)
	}
	// A sparse delta where the version's format is 3 (whose readers cannot
	// read it) is refused and says so.
	if _, err := decodeX(g, size, false); !errors.Is(err, ErrDelta) || !strings.Contains(err.Error(), "format version 4") {
		t.Errorf("a sparse delta in a version of format 3: %v", err)
	}
}

// TestSparseDeltaVersionFormat: a version with a sparse delta is sealed
// as format version 4 (its top-level index of media type index.v4+json,
// which bdnvol readers of format 3 refuse with "a format newer than this
// bdnvol reads: upgrade bdnvol", as TestNewerFormatRefused shows for 5);
// one whose deltas are all "BDX1" blobs stays format 3; both read back;
// a format 3 version that holds a sparse delta is refused, nothing served.
func TestSparseDeltaVersionFormat(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		sparse bool
		format int
		media  string
	}{
		{"sparse", true, FormatVersion4, MediaTypeIndexV4},
		{"dense", false, FormatVersion3, MediaTypeIndexV3},
	} {
		t.Run(c.name, func(t *testing.T) {
			store, root, chunks, _ := deltaVersion(t, func(plain, base []byte) []byte {
				d, err := encodeDelta(plain, base, Planes16, c.sparse)
				if err != nil {
					t.Fatal(err)
				}
				return d
			})
			v, err := Open(ctx, store, root)
			if err != nil {
				t.Fatal(err)
			}
			media := ""
			for _, l := range v.Meta {
				if strings.HasPrefix(l.MediaType, "application/vnd.bdnvol.index.v") {
					media = l.MediaType
				}
			}
			if media != c.media || v.Index.FormatVersion() != c.format {
				t.Fatalf("index %s, format %d; want %s, %d", media, v.Index.FormatVersion(), c.media, c.format)
			}
			b, err := verify.Fetch(ctx, v.ChunkSource(store), "chunk", v.Chunk(1))
			if err != nil || !bytes.Equal(b, chunks[1]) {
				t.Fatalf("delta chunk: %v", err)
			}
		})
	}
	t.Run("sparse in format 3", func(t *testing.T) {
		// A writer that seals a sparse delta as format 3.
		store, root, _, _ := deltaVersionAs(t, func(plain, base []byte) []byte { return mustDelta(t, plain, base, Planes16) }, FormatVersion3)
		v, err := Open(ctx, store, root)
		if err != nil {
			t.Fatal(err)
		}
		if v.Index.FormatVersion() != FormatVersion3 {
			t.Fatalf("format %d", v.Index.FormatVersion())
		}
		b, err := verify.Fetch(ctx, v.ChunkSource(store), "chunk", v.Chunk(1))
		if !errors.Is(err, ErrDelta) || !strings.Contains(err.Error(), "format version 4") || b != nil {
			t.Fatalf("a sparse delta in a format 3 version: %v", err)
		}
	})
}
