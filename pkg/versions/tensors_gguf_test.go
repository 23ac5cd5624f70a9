package versions

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

// TestCompareTensorsGGUF compares two GGUF files: a tensor rewritten, one
// re-quantised (another ggml type), one added, one removed, the others
// unchanged, told from the header chunks and the file indexes alone.
func TestCompareTensorsGGUF(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	f16 := func(name string, seed byte) testutil.GGUFTensor {
		return testutil.GGUFTensor{Name: name, Type: 1, Dims: []uint64{64, 320}, Data: testutil.Pattern(seed, 40<<10)}
	}
	a := []testutil.GGUFTensor{f16("w.0", 1), f16("w.1", 2), f16("w.2", 3), f16("w.3", 4), f16("w.4", 5)}
	q8 := testutil.GGUFTensor{Name: "w.2", Type: 8, Dims: []uint64{64, 320}, Data: testutil.Pattern(3, 20480/32*34)}
	b := []testutil.GGUFTensor{a[0], f16("w.1", 7), q8, f16("new", 8), a[3]}
	meta := []string{"general.architecture", "llama"}
	va := pushVersion(t, tg, map[string][]byte{"m.gguf": testutil.GGUF(meta, 32, a)}, t0, "a")
	vb := pushVersion(t, tg, map[string][]byte{"m.gguf": testutil.GGUF(meta, 32, b)}, t0.Add(time.Minute), "b")
	d, err := CompareTensors(ctx, Located{tg, va.Root}, Located{tg, vb.Root}, TensorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Files, []string{"m.gguf"}) || len(d.Added) != 1 || d.Added[0].Name != "new" || len(d.Removed) != 1 || d.Removed[0].Name != "w.4" {
		t.Fatalf("files %v, added %+v, removed %+v", d.Files, d.Added, d.Removed)
	}
	got := map[string][]string{}
	for _, c := range d.Changed {
		got[c.Name] = c.What
	}
	if len(got) != 2 || !slices.Equal(got["w.1"], []string{"bytes"}) || !slices.Equal(got["w.2"], []string{"dtype", "bytes"}) {
		t.Errorf("changed %v", got)
	}
	for _, c := range d.Changed {
		if c.Name == "w.2" && (c.OldDtype != "F16" || c.Dtype != "Q8_0" || c.OldBytes != 40<<10 || c.Bytes != 20480/32*34) {
			t.Errorf("re-quantised %+v", c)
		}
	}
	if d.Unchanged != 2 || d.UnchangedBytes != 80<<10 || len(d.Undecided) != 0 {
		t.Errorf("unchanged %d (%d bytes), undecided %+v", d.Unchanged, d.UnchangedBytes, d.Undecided)
	}
	if len(d.Added) == 1 && (d.Added[0].Dtype != "F16" || !slices.Equal(d.Added[0].Shape, []int64{64, 320})) {
		t.Errorf("added %+v", d.Added[0])
	}
}
