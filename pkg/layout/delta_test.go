package layout

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/sha2x"
	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/internal/verify"
)

// bf16Step returns n bytes of bf16 weights and the same weights after an
// RL-like step: frac of the elements moved by a small relative amount.
func bf16Step(n int, frac float64, seed uint64) (base, next []byte) {
	r := rand.New(rand.NewPCG(seed, 1))
	base, next = make([]byte, n), make([]byte, n)
	for i := 0; i+1 < n; i += 2 {
		w := float32(r.NormFloat64() * 0.02)
		binary.LittleEndian.PutUint16(base[i:], uint16(math.Float32bits(w)>>16))
		if r.Float64() < frac {
			w *= 1 + float32(r.NormFloat64()*0.05)
		}
		binary.LittleEndian.PutUint16(next[i:], uint16(math.Float32bits(w)>>16))
	}
	return base, next
}

// bf16Tune returns n bytes of bf16 weights and the same weights after a
// full fine-tune: every element moved by a relative amount of about rel.
func bf16Tune(n int, rel float64, seed uint64) (base, next []byte) {
	r := rand.New(rand.NewPCG(seed, 1))
	base, next = make([]byte, n), make([]byte, n)
	for i := 0; i+1 < n; i += 2 {
		v := uint16(math.Float32bits(float32(r.NormFloat64()*0.02)) >> 16)
		binary.LittleEndian.PutUint16(base[i:], v)
		w := math.Float32frombits(uint32(v)<<16) * float32(1+rel*r.NormFloat64())
		binary.LittleEndian.PutUint16(next[i:], uint16(math.Float32bits(w)>>16))
	}
	return base, next
}

func TestDeltaCodecRoundTrip(t *testing.T) {
	base, next := bf16Step(1<<20, 0.02, 1)
	for _, planes := range []int{PlanesRaw, Planes16, Planes32} {
		d, err := EncodeDelta(next, base, planes)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeDelta(d, base, int64(len(next)))
		if err != nil || !bytes.Equal(got, next) {
			t.Fatalf("planes %d: decode: %v, equal %v", planes, err, bytes.Equal(got, next))
		}
		if planes == Planes16 && len(d) > len(next)/16 {
			t.Errorf("bf16 planes: delta of %d bytes for a chunk of %d, want at most 1/16", len(d), len(next))
		}
	}
	// An odd length keeps its last byte.
	got, err := DecodeDelta(mustDelta(t, next[:1001], base[:1001], Planes32), base[:1001], 1001)
	if err != nil || !bytes.Equal(got, next[:1001]) {
		t.Fatalf("odd length: %v", err)
	}
}

func mustDelta(t *testing.T, plain, base []byte, planes int) []byte {
	t.Helper()
	d, err := EncodeDelta(plain, base, planes)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDeltaDecodeBounded: a delta that decodes to more or fewer bytes than
// its chunk, a truncated one and garbage are refused with ErrDelta.
func TestDeltaDecodeBounded(t *testing.T) {
	base, next := bf16Step(1<<16, 0.02, 2)
	longer := mustDelta(t, append(append([]byte{}, next...), 1, 2, 3), append(append([]byte{}, base...), 0, 0, 0), PlanesRaw)
	if _, err := DecodeDelta(longer, base, int64(len(base))); !errors.Is(err, ErrDelta) {
		t.Errorf("a delta of more bytes: %v", err)
	}
	shorter := mustDelta(t, next[:100], base[:100], PlanesRaw)
	if _, err := DecodeDelta(shorter, base, int64(len(base))); !errors.Is(err, ErrDelta) {
		t.Errorf("a delta of fewer bytes: %v", err)
	}
	d := mustDelta(t, next, base, Planes16)
	if _, err := DecodeDelta(d[:len(d)/2], base, int64(len(base))); !errors.Is(err, ErrDelta) {
		t.Errorf("a truncated delta: %v", err)
	}
	if _, err := DecodeDelta([]byte("BDX1\x02garbage"), base, int64(len(base))); !errors.Is(err, ErrDelta) {
		t.Errorf("garbage: %v", err)
	}
	if _, err := DecodeDelta(d, base[:10], int64(len(base))); !errors.Is(err, ErrDelta) {
		t.Errorf("a short base: %v", err)
	}
}

// FuzzDecodeDelta: any blob, of either encoding, decodes to its size or
// is refused with ErrDelta, without a panic; one that decodes gives the
// same bytes XORed in a range at a time.
func FuzzDecodeDelta(f *testing.F) {
	base, next := bf16Step(4096, 0.05, 3)
	d, _ := encodeDelta(next, base, Planes16, false)
	f.Add(d, int64(4096))
	f.Add(d[:20], int64(4096))
	for _, planes := range []int{PlanesRaw, Planes16, Planes32} {
		s, _ := EncodeDelta(next, base, planes)
		f.Add(s, int64(4096))
		f.Add(s[:len(s)/2], int64(4096))
		f.Add(s, int64(4097))
	}
	ftBase, ftNext := bf16Tune(4098, 0.01, 3)
	s, _ := EncodeDelta(ftNext, ftBase, Planes32)
	f.Add(s, int64(4098))
	f.Fuzz(func(t *testing.T, delta []byte, size int64) {
		if size <= 0 || size > 1<<20 {
			return
		}
		b := make([]byte, size)
		out, err := DecodeDelta(delta, b, size)
		if err != nil {
			if !errors.Is(err, ErrDelta) || out != nil {
				t.Fatalf("refused with %v", err)
			}
			return
		}
		if int64(len(out)) != size {
			t.Fatalf("decoded %d bytes for %d", len(out), size)
		}
		xd, err := decodeX(delta, size, true)
		if err != nil {
			t.Fatalf("decodes once, not twice: %v", err)
		}
		defer xd.release()
		got := make([]byte, size)
		mid := xd.m / 16 * 8
		xd.xorRange(got, mid, xd.m)
		xd.xorRange(got, 0, mid)
		if !bytes.Equal(got, out) {
			t.Fatal("ranges out of order decode other bytes")
		}
	})
}

// deltaVersion stores a version 2 volume of one file of three 1 MiB chunks
// whose middle one is stored as a delta (made by mk) against a base chunk
// of another version, and returns the store, the version's root and the
// plain chunks.
func deltaVersion(t *testing.T, mk func(plain, base []byte) []byte) (*memory.Store, ocispec.Descriptor, [][]byte, []byte) {
	t.Helper()
	return deltaVersionAs(t, mk, 0)
}

// deltaVersionAs is deltaVersion with the delta's Format set to format
// (when not 0; else as a writer sets it, with DeltaFormat).
func deltaVersionAs(t *testing.T, mk func(plain, base []byte) []byte, format int) (*memory.Store, ocispec.Descriptor, [][]byte, []byte) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	base, next := bf16Step(1<<20, 0.02, 4)
	chunks := [][]byte{bytes.Repeat([]byte{1}, 1<<20), next, bytes.Repeat([]byte{3}, 1<<20)}
	x := &Index{Version: FormatVersion, Chunking: DefaultParams}
	var exts []Extent
	h := digest.SHA256.Digester()
	for i, c := range chunks {
		ch := Chunk{Digest: digest.FromBytes(c), Size: int64(len(c))}
		ch.Head, ch.Tail = digest.FromBytes(c[:EdgeBytes]), digest.FromBytes(c[len(c)-EdgeBytes:])
		x.Chunks = append(x.Chunks, ch)
		exts = append(exts, Extent{i, 0, ch.Size})
		h.Hash().Write(c)
		if i != 1 {
			if err := store.Push(ctx, ch.Descriptor(), bytes.NewReader(c)); err != nil {
				t.Fatal(err)
			}
		}
	}
	x.Files = []File{{Path: "model.safetensors", Type: TypeFile, Mode: 0o644, Size: 3 << 20, Digest: h.Digest(), Extents: exts}}
	s, err := Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	bd := content.NewDescriptorFromBytes(MediaTypeChunk, base)
	if err := store.Push(ctx, bd, bytes.NewReader(base)); err != nil {
		t.Fatal(err)
	}
	delta := mk(next, base)
	d := Delta{Chunk: x.Chunks[1].Digest, Size: 1 << 20, Digest: digest.FromBytes(delta), DeltaSize: int64(len(delta)), Base: bd.Digest, Format: DeltaFormat(delta)}
	if format != 0 {
		d.Format = format
	}
	if err := store.Push(ctx, d.Descriptor(), bytes.NewReader(delta)); err != nil {
		t.Fatal(err)
	}
	s, err = s.WithDeltas(map[digest.Digest]Delta{d.Chunk: d}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store(ctx, store); err != nil {
		t.Fatal(err)
	}
	return store, s.Root.Desc, chunks, base
}

func TestDeltaVersionReads(t *testing.T) {
	ctx := context.Background()
	store, root, chunks, base := deltaVersion(t, func(plain, base []byte) []byte {
		d, _ := EncodeDelta(plain, base, Planes16)
		return d
	})
	v, err := Open(ctx, store, root)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := v.Index.Delta(1)
	if !ok || len(v.Index.Deltas()) != 1 {
		t.Fatalf("chunk 1 not a delta: %v", v.Index.Deltas())
	}
	if got := v.Index.Bases(); len(got) != 1 || got[0].Digest != digest.FromBytes(base) {
		t.Fatalf("bases %v", got)
	}
	src := v.ChunkSource(store)
	for k, want := range chunks {
		b, err := verify.Fetch(ctx, src, "chunk", v.Chunk(k))
		if err != nil || !bytes.Equal(b, want) {
			t.Fatalf("chunk %d: %v", k, err)
		}
	}
	// A range of a delta chunk is cut from the decoded chunk.
	rc, err := src.(*deltaSource).fetchRange(ctx, v.Chunk(1), 10, 20)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	if !bytes.Equal(got, chunks[1][10:30]) {
		t.Fatal("range of a delta chunk")
	}
	// The manifest lists the delta blob and the base: what keeps them.
	m, err := content.FetchAll(ctx, store, root)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []digest.Digest{d.Digest, d.Base} {
		if !strings.Contains(string(m), string(want)) {
			t.Errorf("manifest does not list %s", want)
		}
	}
	if strings.Contains(string(m), string(d.Chunk)) {
		t.Errorf("manifest lists the plain chunk %s, which is not stored", d.Chunk)
	}
}

// lyingFetcher serves other bytes for one digest.
type lyingFetcher struct {
	content.Fetcher
	d    digest.Digest
	data []byte
}

func (f lyingFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if desc.Digest == f.d {
		return io.NopCloser(bytes.NewReader(f.data)), nil
	}
	return f.Fetcher.Fetch(ctx, desc)
}

// TestDeltaHostile: a lying base, a truncated delta and a delta that
// decodes to other bytes than its chunk's are refused; nothing is served.
func TestDeltaHostile(t *testing.T) {
	ctx := context.Background()
	t.Run("lying base", func(t *testing.T) {
		store, root, _, base := deltaVersion(t, func(plain, base []byte) []byte { return mustDelta(t, plain, base, Planes16) })
		v, err := Open(ctx, store, root)
		if err != nil {
			t.Fatal(err)
		}
		other := bytes.Clone(base)
		other[5] ^= 1
		src := v.ChunkSource(lyingFetcher{store, digest.FromBytes(base), other})
		b, err := verify.Fetch(ctx, src, "chunk", v.Chunk(1))
		if !errors.Is(err, verify.ErrDigestMismatch) || b != nil {
			t.Fatalf("lying base served: %v", err)
		}
		// A local base that lies is not used: the base is fetched.
		ctx := WithLocalBases(ctx, func(_ context.Context, _ ocispec.Descriptor, dst []byte) error { copy(dst, other); return nil })
		if _, err := verify.Fetch(ctx, v.ChunkSource(store), "chunk", v.Chunk(1)); err != nil {
			t.Fatalf("a lying local base not replaced by the fetched one: %v", err)
		}
	})
	t.Run("truncated delta", func(t *testing.T) {
		store, root, _, _ := deltaVersion(t, func(plain, base []byte) []byte {
			d := mustDelta(t, plain, base, Planes16)
			return d[:len(d)-7]
		})
		v, err := Open(ctx, store, root)
		if err != nil {
			t.Fatal(err)
		}
		b, err := verify.Fetch(ctx, v.ChunkSource(store), "chunk", v.Chunk(1))
		if !errors.Is(err, ErrDelta) || b != nil {
			t.Fatalf("truncated delta: %v", err)
		}
	})
	t.Run("decodes to other bytes", func(t *testing.T) {
		store, root, _, _ := deltaVersion(t, func(plain, base []byte) []byte {
			p := bytes.Clone(plain)
			p[100] ^= 0x40
			return mustDelta(t, p, base, Planes16)
		})
		v, err := Open(ctx, store, root)
		if err != nil {
			t.Fatal(err)
		}
		b, err := verify.Fetch(ctx, v.ChunkSource(store), "chunk", v.Chunk(1))
		if !errors.Is(err, verify.ErrDigestMismatch) || b != nil {
			t.Fatalf("a delta decoding to other bytes: %v", err)
		}
		// The delta is named, not the base: decoded in place, the base is
		// restored before it is hashed to tell which lied; a right local
		// base is not fetched instead.
		if !strings.Contains(err.Error(), "decoded delta") || strings.Contains(err.Error(), "base") {
			t.Errorf("a delta decoding to other bytes blamed on %v", err)
		}
		d, _ := v.Index.Delta(1)
		base, err := content.FetchAll(ctx, store, d.BaseDescriptor())
		if err != nil {
			t.Fatal(err)
		}
		var fetched atomic.Int64
		counting := countingFetcher{store, d.Base, &fetched}
		lctx := WithLocalBases(ctx, func(_ context.Context, _ ocispec.Descriptor, dst []byte) error { copy(dst, base); return nil })
		_, err = verify.Fetch(lctx, v.ChunkSource(counting), "chunk", v.Chunk(1))
		if !strings.Contains(fmt.Sprint(err), "decoded delta") || fetched.Load() != 0 {
			t.Errorf("with a right local base: %v, the base fetched %d times", err, fetched.Load())
		}
	})
}

// countingFetcher counts the fetches of one digest.
type countingFetcher struct {
	content.Fetcher
	d digest.Digest
	n *atomic.Int64
}

func (f countingFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if desc.Digest == f.d {
		f.n.Add(1)
	}
	return f.Fetcher.Fetch(ctx, desc)
}

// TestNewerFormatRefused: an index of a format newer than this reader's is
// refused with a message that says so.
func TestNewerFormatRefused(t *testing.T) {
	ctx := context.Background()
	store := memory.New()
	top := []byte(`{"version":5}`)
	td := content.NewDescriptorFromBytes("application/vnd.bdnvol.index.v5+json", top)
	if err := store.Push(ctx, td, bytes.NewReader(top)); err != nil {
		t.Fatal(err)
	}
	root := pushJSON(t, store, ocispec.MediaTypeImageManifest, ocispec.Manifest{
		MediaType: ocispec.MediaTypeImageManifest, ArtifactType: ArtifactTypeVolume,
		Config: ocispec.DescriptorEmptyJSON, Layers: []ocispec.Descriptor{td}})
	_, err := Open(ctx, store, root)
	if err == nil || !strings.Contains(err.Error(), "newer than this bdnvol reads") {
		t.Fatalf("got %v", err)
	}
}

// BenchmarkDecodeDelta decodes the delta of a 16 MiB bf16 chunk after an
// RL-like step (2 % of the elements moved). bench/delta.sh reports it.
func BenchmarkDecodeDelta(b *testing.B) {
	base, next := bf16Step(16<<20, 0.02, 5)
	d, _ := EncodeDelta(next, base, Planes16)
	benchDecode(b, d, base, next)
}

// BenchmarkDenseDecode is BenchmarkDecodeDelta for the "BDX1" blob of the
// same chunk (format version 3's encoding).
func BenchmarkDenseDecode(b *testing.B) {
	base, next := bf16Step(16<<20, 0.02, 5)
	d, _ := encodeDelta(next, base, Planes16, false)
	benchDecode(b, d, base, next)
}

// BenchmarkFinetuneDecode decodes the delta of a 16 MiB bf16 chunk of a
// full fine-tune (every element moved by about 1 %).
func BenchmarkFinetuneDecode(b *testing.B) {
	base, next := bf16Tune(16<<20, 0.01, 5)
	d, _ := EncodeDelta(next, base, Planes16)
	benchDecode(b, d, base, next)
}

// BenchmarkFinetuneDenseDecode is BenchmarkFinetuneDecode for the "BDX1"
// blob of the same chunk.
func BenchmarkFinetuneDenseDecode(b *testing.B) {
	base, next := bf16Tune(16<<20, 0.01, 5)
	d, _ := encodeDelta(next, base, Planes16, false)
	benchDecode(b, d, base, next)
}

// benchDecode decodes delta d of next over base, in place as the delta
// source does, reporting MB per CPU second and the delta's size.
func benchDecode(b *testing.B, d, base, next []byte) {
	b.ReportMetric(float64(len(d))/float64(len(next)), "delta/chunk")
	b.SetBytes(int64(len(next)))
	b.ReportAllocs()
	// CPU time as well as wall: on a loaded machine the wall time says
	// little about one core's throughput.
	var r0, r1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	// In place over the base, as the delta source decodes (each pass
	// turns the buffer into the other of base and chunk: the same work);
	// not the hash of the chunk, which a plain chunk costs too.
	buf := bytes.Clone(base)
	for b.Loop() {
		xd, err := decodeX(d, int64(len(next)), true)
		if err != nil {
			b.Fatal(err)
		}
		xd.xorAll(buf)
		xd.release()
	}
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := time.Duration(r1.Utime.Nano() + r1.Stime.Nano() - r0.Utime.Nano() - r0.Stime.Nano())
	b.ReportMetric(float64(len(next))*float64(b.N)/cpu.Seconds()/1e6, "MB/cpu-s")
}

// TestDeltaVersionMustListBases: a version 3 manifest whose layers do not
// list a delta's base (which a registry's garbage collector would then be
// free to delete) or its delta blob is refused when opened.
func TestDeltaVersionMustListBases(t *testing.T) {
	ctx := context.Background()
	store, root, _, base := deltaVersion(t, func(plain, base []byte) []byte { return mustDelta(t, plain, base, Planes16) })
	mb, err := content.FetchAll(ctx, store, root)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		t.Fatal(err)
	}
	drop := func(pred func(ocispec.Descriptor) bool) ocispec.Manifest {
		c := m
		c.Layers = nil
		for _, l := range m.Layers {
			if !pred(l) {
				c.Layers = append(c.Layers, l)
			}
		}
		return c
	}
	for name, mm := range map[string]ocispec.Manifest{
		"no base":       drop(func(l ocispec.Descriptor) bool { return l.Digest == digest.FromBytes(base) }),
		"no delta blob": drop(func(l ocispec.Descriptor) bool { return l.MediaType == MediaTypeChunkDelta }),
		"no table":      drop(func(l ocispec.Descriptor) bool { return l.MediaType == MediaTypeDeltas }),
	} {
		d := pushJSON(t, store, ocispec.MediaTypeImageManifest, mm)
		if _, err := Open(ctx, store, d); !errors.Is(err, ErrInvalidIndex) {
			t.Errorf("%s: opened (%v)", name, err)
		}
	}
}

// joinBytes is join one byte at a time: the reference the word-wise join
// must match.
func joinBytes(x, base []byte, planes int) []byte {
	n := len(base)
	dst := make([]byte, n)
	m := n / planes
	for j := range n {
		if j < m*planes {
			dst[j] = base[j] ^ x[(j%planes)*m+j/planes]
		} else {
			dst[j] = base[j] ^ x[j]
		}
	}
	return dst
}

// TestJoinMatchesBytewise: the word-wise join of every plane layout, over
// lengths that are not whole words or whole elements and over sparse and
// dense XORs, gives the bytes of the byte-at-a-time join.
func TestJoinMatchesBytewise(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for _, planes := range []int{PlanesRaw, Planes16, Planes32} {
		for _, n := range []int{0, 1, 3, 7, 15, 16, 17, 63, 64, 65, 127, 1000, 4099} {
			for _, density := range []float64{0, 0.01, 0.3, 1} {
				base, x := make([]byte, n), make([]byte, n)
				for i := range base {
					base[i] = byte(r.Uint32())
					if r.Float64() < density {
						x[i] = byte(r.Uint32())
					}
				}
				got := make([]byte, n)
				for i := range got {
					got[i] = 0xAA // join must overwrite every byte
				}
				join(got, x, base, planes)
				if want := joinBytes(x, base, planes); !bytes.Equal(got, want) {
					t.Fatalf("planes %d, %d bytes, density %v: join differs from the bytewise join", planes, n, density)
				}
			}
		}
	}
}

// TestDeltaDecodeHashesOnce: a delta chunk read cold is hashed once, as
// the decoded chunk; its base is not hashed on the way (the chunk's digest
// vouches for it), only when the chunk fails, to say which lied.
func TestDeltaDecodeHashesOnce(t *testing.T) {
	ctx := context.Background()
	var hashed []string
	old := verifyBytes
	verifyBytes = func(what string, b []byte, desc ocispec.Descriptor) error {
		hashed = append(hashed, what)
		return old(what, b, desc)
	}
	t.Cleanup(func() { verifyBytes = old })
	var chunkHashed atomic.Int64
	oldHash := newChunkHash
	newChunkHash = func() hash.Hash { return testutil.NewCountingHash(&chunkHashed) }
	t.Cleanup(func() { newChunkHash = oldHash })
	store, root, chunks, base := deltaVersion(t, func(plain, base []byte) []byte { return mustDelta(t, plain, base, Planes16) })
	v, err := Open(ctx, store, root)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := v.ChunkSource(store).Fetch(ctx, v.Chunk(1))
	if err != nil {
		t.Fatal(err)
	}
	if ck, ok := rc.(*verify.Checked); !ok || !ck.Vouches(v.Chunk(1)) {
		t.Errorf("the decoded chunk does not come as verified (%T)", rc)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, chunks[1]) {
		t.Fatalf("decode: %v, equal %v", err, bytes.Equal(got, chunks[1]))
	}
	if n := chunkHashed.Load(); len(hashed) != 0 || n != v.Chunk(1).Size {
		t.Errorf("hashed %d bytes of the chunk and %q whole, want the chunk once (%d bytes), nothing else", n, hashed, v.Chunk(1).Size)
	}
	// A lying base: refused, and named as the base.
	hashed = nil
	other := bytes.Clone(base)
	other[9] ^= 1
	_, err = v.ChunkSource(lyingFetcher{store, digest.FromBytes(base), other}).Fetch(ctx, v.Chunk(1))
	if !errors.Is(err, verify.ErrDigestMismatch) || !strings.Contains(err.Error(), "base") {
		t.Fatalf("lying base: %v", err)
	}
	// A short base: refused.
	_, err = v.ChunkSource(lyingFetcher{store, digest.FromBytes(base), base[:100]}).Fetch(ctx, v.Chunk(1))
	if !errors.Is(err, verify.ErrDigestMismatch) {
		t.Fatalf("short base: %v", err)
	}
}

// deltaChunksVersion stores a version of one file whose chunks, of sizes,
// are all stored as bf16 deltas against bases of another version, and
// returns the store, the version and the plain chunks.
func deltaChunksVersion(t *testing.T, sizes []int) (*memory.Store, *Version, [][]byte) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	x := &Index{Version: FormatVersion, Chunking: DefaultParams}
	var (
		exts   []Extent
		chunks [][]byte
		total  int64
	)
	h := digest.SHA256.Digester()
	ds := map[digest.Digest]Delta{}
	for i, n := range sizes {
		base, next := bf16Step(n, 0.02, uint64(10+i))
		ch := Chunk{Digest: digest.FromBytes(next), Size: int64(n)}
		ch.Head, ch.Tail = digest.FromBytes(next[:EdgeBytes]), digest.FromBytes(next[n-EdgeBytes:])
		x.Chunks = append(x.Chunks, ch)
		exts = append(exts, Extent{i, 0, ch.Size})
		h.Hash().Write(next)
		chunks = append(chunks, next)
		total += int64(n)
		bd := content.NewDescriptorFromBytes(MediaTypeChunk, base)
		delta := mustDelta(t, next, base, Planes16)
		d := Delta{Chunk: ch.Digest, Size: int64(n), Digest: digest.FromBytes(delta), DeltaSize: int64(len(delta)), Base: bd.Digest}
		for _, b := range []struct {
			desc ocispec.Descriptor
			data []byte
		}{{bd, base}, {d.Descriptor(), delta}} {
			if err := store.Push(ctx, b.desc, bytes.NewReader(b.data)); err != nil {
				t.Fatal(err)
			}
		}
		ds[d.Chunk] = d
	}
	x.Files = []File{{Path: "model.safetensors", Type: TypeFile, Mode: 0o644, Size: total, Digest: h.Digest(), Extents: exts}}
	s, err := Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s, err = s.WithDeltas(ds, 0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store(ctx, store); err != nil {
		t.Fatal(err)
	}
	v, err := Open(ctx, store, s.Root.Desc)
	if err != nil {
		t.Fatal(err)
	}
	return store, v, chunks
}

// TestDeltaDecodeInPlace: a delta chunk is decoded in place over its base's
// buffer: a cold read (empty pools) allocates two chunk-sized buffers, the
// base and the decoded planes, not a third for the chunk (nor a copy of
// the base into it).
func TestDeltaDecodeInPlace(t *testing.T) {
	ctx := context.Background()
	const size = 4 << 20
	store, v, chunks := deltaChunksVersion(t, []int{size})
	src := v.ChunkSource(store)
	runtime.GC()
	runtime.GC() // empties the pools
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	rc, err := src.Fetch(ctx, v.Chunk(0)) // decoded and verified by now
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&m1)
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, chunks[0]) {
		t.Fatalf("the decoded chunk: %v, right %v", err, bytes.Equal(got, chunks[0]))
	}
	// The planes' buffer is of the size class above the chunk's (1.25x).
	if n := m1.TotalAlloc - m0.TotalAlloc; n > 5*size/2 {
		t.Errorf("a cold decode of a %d-byte chunk allocated %d bytes, want at most %d (base and planes)", size, n, 5*size/2)
	}
}

// TestXorPlanesRange: XORing the planes in pieces, as a reader does to
// hash each piece while it is in the cache, gives the bytes of XORing them
// whole, for every plane layout and lengths that are not whole elements.
func TestXorPlanesRange(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, planes := range []int{PlanesRaw, Planes16, Planes32} {
		for _, n := range []int{1, 7, 64, 1001, 70001} {
			base, x := make([]byte, n), make([]byte, n)
			for i := range base {
				base[i], x[i] = byte(r.Uint32()), byte(r.Uint32())
			}
			want := bytes.Clone(base)
			xorPlanes(want, x, planes)
			got := bytes.Clone(base)
			m := n / planes
			for lo := 0; ; lo += 16 {
				hi := min(lo+16, m)
				xorPlanesRange(got, x, planes, lo, hi)
				if hi == m {
					break
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("planes %d, %d bytes: in pieces differs from whole", planes, n)
			}
		}
	}
}

// rangeStore serves ranges of a memory store's blobs, counting whole
// fetches and range requests by digest; noRanges makes every range
// request fail as a source without ranges does.
type rangeStore struct {
	*memory.Store
	noRanges bool
	whole    map[digest.Digest]int
	ranges   map[digest.Digest]int
	mu       sync.Mutex
}

func (s *rangeStore) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	s.mu.Lock()
	s.whole[desc.Digest]++
	s.mu.Unlock()
	return s.Store.Fetch(ctx, desc)
}

func (s *rangeStore) FetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	s.mu.Lock()
	s.ranges[desc.Digest]++
	s.mu.Unlock()
	if s.noRanges {
		return nil, fmt.Errorf("no ranges: %w", errors.ErrUnsupported)
	}
	b, err := content.FetchAll(ctx, s.Store, desc)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(b[off : off+n])), nil
}

// TestDeltaBaseSplit: under WithBaseParts (a mount's read that waits for a
// delta chunk), a large base is fetched as concurrent range requests of
// about 2 MiB, not whole; without it, or from a source that serves no
// ranges, whole; the chunk decodes right either way.
func TestDeltaBaseSplit(t *testing.T) {
	ctx := context.Background()
	const size = 8 << 20
	store, v, chunks := deltaChunksVersion(t, []int{size})
	d, _ := v.Index.Delta(0)
	for _, c := range []struct {
		name              string
		ctx               context.Context
		noRanges          bool
		wantWhole, ranges int
	}{
		{"split", WithBaseParts(ctx, 8), false, 0, 4},
		{"no parts asked", ctx, false, 1, 0},
		{"no ranges", WithBaseParts(ctx, 8), true, 1, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := &rangeStore{Store: store, noRanges: c.noRanges, whole: map[digest.Digest]int{}, ranges: map[digest.Digest]int{}}
			got, err := verify.Fetch(c.ctx, v.ChunkSource(src), "chunk", v.Chunk(0))
			if err != nil || !bytes.Equal(got, chunks[0]) {
				t.Fatalf("decode: %v, equal %v", err, bytes.Equal(got, chunks[0]))
			}
			if src.whole[d.Base] != c.wantWhole || (c.ranges >= 0 && src.ranges[d.Base] != c.ranges) {
				t.Errorf("the base fetched whole %d times, by %d ranges; want %d whole, %d ranges", src.whole[d.Base], src.ranges[d.Base], c.wantWhole, c.ranges)
			}
		})
	}
}

// TestDeltaDecodeHashesInPairs: under WithHashPairs a decoded chunk's
// pieces are offered to the pairer, so a stream waiting there (another
// chunk, streamed) is hashed beside the chunk's first piece; both digests
// come out right. Without SHA extensions an offer is hashed at once and
// nothing pairs: then only the digests are checked.
func TestDeltaDecodeHashesInPairs(t *testing.T) {
	ctx := context.Background()
	store, root, chunks, base := deltaVersion(t, func(plain, base []byte) []byte { return mustDelta(t, plain, base, Planes16) })
	v, err := Open(ctx, store, root)
	if err != nil {
		t.Fatal(err)
	}
	var pairs sha2x.Pairer
	other := sha2x.NewDigest()
	waiting := bytes.Repeat([]byte("another chunk streamed "), 1<<14)
	o := pairs.Offer(other, waiting)
	rc, err := v.ChunkSource(store).Fetch(WithHashPairs(ctx, &pairs), v.Chunk(1))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, chunks[1]) {
		t.Fatalf("decode: %v, equal %v", err, bytes.Equal(got, chunks[1]))
	}
	pairs.Collect(o)
	if got, want := digest.NewDigest(digest.SHA256, other), digest.FromBytes(waiting); got != want {
		t.Errorf("the waiting stream hashed to %s, want %s", got, want)
	}
	if o != nil && pairs.Paired() != 1 {
		t.Errorf("%d offers hashed in pairs, want 1: the decode did not take the waiting stream", pairs.Paired())
	}
	// A lying base is still refused under pairs, and named as the base.
	bad := bytes.Clone(base)
	bad[3] ^= 1
	_, err = v.ChunkSource(lyingFetcher{store, digest.FromBytes(base), bad}).Fetch(WithHashPairs(ctx, &pairs), v.Chunk(1))
	if !errors.Is(err, verify.ErrDigestMismatch) || !strings.Contains(err.Error(), "base") {
		t.Errorf("a lying base under pairs: %v, want a digest mismatch of the base", err)
	}
}
