package versions

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/pkg/layout"
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
	big := func(seed byte) []byte { return pattern(seed, 40<<10) }
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
	d, err := CompareTensors(ctx, Side{src, va.Root}, Side{src, vb.Root}, TensorOptions{})
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
