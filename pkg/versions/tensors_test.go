package versions

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

type testTensor struct {
	name  string
	dtype string
	shape []int64
	data  []byte
}

// safetensors builds a safetensors file of ts, in order.
func safetensors(ts []testTensor) []byte {
	hdr := map[string]any{}
	var off int64
	var data []byte
	for _, t := range ts {
		hdr[t.name] = map[string]any{"dtype": t.dtype, "shape": t.shape, "data_offsets": []int64{off, off + int64(len(t.data))}}
		off += int64(len(t.data))
		data = append(data, t.data...)
	}
	h, _ := json.Marshal(hdr)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	return append(append(out, h...), data...)
}

func TestCompareTensors(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	big := func(seed byte) []byte { return testutil.Pattern(seed, 40<<10) }
	a := []testTensor{
		{"w.0", "F16", []int64{160, 128}, big(1)},
		{"w.1", "F16", []int64{160, 128}, big(2)},
		{"w.2", "F16", []int64{160, 128}, big(3)},
		{"w.3", "F16", []int64{160, 128}, big(4)},
		{"w.4", "F16", []int64{160, 128}, big(5)},
		{"w.5", "F16", []int64{160, 128}, big(6)},
	}
	b := []testTensor{
		a[0],
		{"w.1", "F16", []int64{160, 128}, big(7)},  // rewritten
		{"w.2", "BF16", []int64{160, 128}, big(3)}, // dtype only
		{"bias", "F16", []int64{20480}, big(8)},    // inserted
		a[3],
		// w.4 removed
		{"w.5", "F16", []int64{128, 160}, big(6)}, // shape only (a transpose's header)
	}
	va := pushVersion(t, tg, map[string][]byte{"m.safetensors": safetensors(a), "x.txt": []byte("x")}, t0, "a")
	vb := pushVersion(t, tg, map[string][]byte{"m.safetensors": safetensors(b), "x.txt": []byte("x")}, t0.Add(time.Minute), "b")
	src := &boundedFetcher{Fetcher: tg, max: 1 << 20}
	d, err := CompareTensors(ctx, Located{src, va.Root}, Located{src, vb.Root}, TensorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Added) != 1 || d.Added[0].Name != "bias" || d.AddedBytes != 40<<10 {
		t.Errorf("added %+v", d.Added)
	}
	if len(d.Removed) != 1 || d.Removed[0].Name != "w.4" || d.Removed[0].Dtype != "F16" || d.RemovedBytes != 40<<10 {
		t.Errorf("removed %+v (%d bytes)", d.Removed, d.RemovedBytes)
	}
	got := map[string][]string{}
	for _, c := range d.Changed {
		got[c.Name] = c.What
	}
	if len(got) != 3 || !slices.Equal(got["w.1"], []string{"bytes"}) || !slices.Equal(got["w.2"], []string{"dtype"}) ||
		!slices.Equal(got["w.5"], []string{"shape"}) {
		t.Errorf("changed %v", got)
	}
	for _, c := range d.Changed {
		if c.Name == "w.5" && (!slices.Equal(c.OldShape, []int64{160, 128}) || !slices.Equal(c.Shape, []int64{128, 160}) || c.OldBytes != c.Bytes) {
			t.Errorf("shape change %+v: want [160 128] -> [128 160], same size", c)
		}
	}
	if d.ChangedBytes != 3*40<<10 {
		t.Errorf("changed bytes %d, want %d", d.ChangedBytes, 3*40<<10)
	}
	if d.Unchanged != 2 || d.UnchangedBytes != 80<<10 {
		t.Errorf("unchanged %d (%d bytes)", d.Unchanged, d.UnchangedBytes)
	}
	// Only the header chunks were fetched, besides the manifests and indexes.
	va2, _ := layout.Open(ctx, tg, va.Root)
	hdrEnd := int64(0)
	for fi := range va2.Index.Len() {
		f := va2.Index.File(fi)
		if f.Path == "m.safetensors" {
			hdrEnd = f.Extents[0].Length
		}
	}
	if d.HeaderChunks != 2 || hdrEnd > 4<<10 {
		t.Errorf("%d header chunks fetched (first extent %d bytes), want 2", d.HeaderChunks, hdrEnd)
	}
	names := []string{}
	for _, c := range d.Changed {
		names = append(names, c.Name)
	}
	if !sort.StringsAreSorted(names) {
		t.Errorf("changed not sorted: %v", names)
	}
}

// sealChunks stores chunks and a version whose one file per entry of files
// is made of those chunks (by index, in order), and returns its root.
func sealChunks(t *testing.T, tg oci.Target, chunks [][]byte, files map[string][]int) ocispec.Descriptor {
	t.Helper()
	ctx := context.Background()
	x := &layout.Index{Version: layout.FormatVersion1, Chunking: smallParams}
	for _, b := range chunks {
		c := layout.Chunk{Digest: digest.FromBytes(b), Size: int64(len(b))}
		if err := tg.Push(ctx, ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: c.Digest, Size: c.Size}, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		x.Chunks = append(x.Chunks, c)
	}
	names := make([]string, 0, len(files))
	for p := range files {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		f := layout.File{Path: p, Type: layout.TypeFile, Mode: 0o644, Digest: digest.FromString(p)}
		for _, k := range files[p] {
			f.Extents = append(f.Extents, layout.Extent{Chunk: k, Length: x.Chunks[k].Size})
			f.Size += x.Chunks[k].Size
		}
		x.Files = append(x.Files, f)
	}
	s, err := layout.Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store(ctx, tg); err != nil {
		t.Fatal(err)
	}
	return s.Root.Desc
}

// TestCompareTensorsHostileHeaderLength: a safetensors prefix declaring a
// 90 MiB header (within the format's 100 MB, far past what real files use)
// is refused, naming the file, before anything of that size is allocated.
func TestCompareTensorsHostileHeaderLength(t *testing.T) {
	tg := openLayout(t)
	head := binary.LittleEndian.AppendUint64(nil, 90<<20)
	head = append(head, bytes.Repeat([]byte(" "), 1<<20-8)...)
	fill := bytes.Repeat([]byte("x"), 1<<20)
	ext := []int{0}
	for range 90 {
		ext = append(ext, 1)
	}
	root := sealChunks(t, tg, [][]byte{head, fill}, map[string][]int{"m.safetensors": ext})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := CompareTensors(context.Background(), Located{tg, root}, Located{tg, root}, TensorOptions{})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, tensorheader.ErrHeaderTooLarge) || !strings.Contains(err.Error(), "m.safetensors") {
		t.Errorf("got %v, want %v naming m.safetensors", err, tensorheader.ErrHeaderTooLarge)
	}
	if a := after.TotalAlloc - before.TotalAlloc; a > 8<<20 {
		t.Errorf("allocated %d MiB for a header it refuses", a>>20)
	}
}

// peakFetcher records the most heap in use when a fetch starts.
type peakFetcher struct {
	content.Fetcher
	peak uint64
}

func (p *peakFetcher) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	p.peak = max(p.peak, m.HeapAlloc)
	return p.Fetcher.Fetch(ctx, d)
}

// TestCompareTensorsKeepsFewChunks: the chunks read for headers are not
// all held until the diff ends: with ten files each one 8 MiB chunk (its
// header and its tensor), the heap stays far below their 80 MiB.
func TestCompareTensorsKeepsFewChunks(t *testing.T) {
	tg := openLayout(t)
	var chunks [][]byte
	files := map[string][]int{}
	const n = 8<<20 - 128
	for i := range 10 {
		h := []byte(`{"t` + strconv.Itoa(i) + `":{"dtype":"U8","shape":[` + strconv.Itoa(n) + `],"data_offsets":[0,` + strconv.Itoa(n) + `]}}`)
		b := append(binary.LittleEndian.AppendUint64(nil, uint64(len(h))), h...)
		chunks = append(chunks, append(b, make([]byte, n)...))
		files["m"+strconv.Itoa(i)+".safetensors"] = []int{i}
	}
	root := sealChunks(t, tg, chunks, files)
	chunks = nil
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	src := &peakFetcher{Fetcher: tg}
	d, err := CompareTensors(context.Background(), Located{src, root}, Located{src, root}, TensorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Unchanged != 10 || d.HeaderChunks != 10 {
		t.Errorf("%d unchanged, %d header chunks; want 10 and 10", d.Unchanged, d.HeaderChunks)
	}
	grew := int64(src.peak) - int64(base.HeapAlloc)
	if grew > 40<<20 {
		t.Errorf("heap grew by %d MiB while fetching", grew>>20)
	}
	t.Logf("heap grew by %d MiB while fetching", grew>>20)
}
