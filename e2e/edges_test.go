package e2e

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// edgeBytes is the format's edge length (docs/format.md).
const edgeBytes = 256 << 10

// TestMountTensorNeighboursFromEdges reads one tensor through a FUSE mount.
// The kernel reads whole pages, so the first and last page are shared with
// the neighbouring tensors, whose chunks are 4 MiB here: those pages must
// come from the neighbours' verified 256 KiB edges, fetched by range, so
// the registry sends the tensor's chunks and two edges, not four chunks.
func TestMountTensorNeighboursFromEdges(t *testing.T) {
	const mib = 1 << 20
	sizes := []int{9*mib + 1234, 10*mib + 777, 9*mib + 99}
	file, begins := safetensorsFile(3, sizes...)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "model.safetensors"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	forTargets(t, func(t *testing.T, tg target) {
		ref := tg.repo("edges") + ":v1"
		push(t, tg.repo("edges"), ref, src, "--chunk-min", "1MiB", "--chunk-avg", "2MiB", "--chunk-max", "4MiB")
		if tg.reg != nil {
			tg.reg.ResetStats()
		}
		mp := mount(t, ref, "--prefetch", "none")
		f, err := os.Open(filepath.Join(mp, "model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		hdr := make([]byte, begins[0])
		if _, err := f.ReadAt(hdr, 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // let readahead of the header settle
		var before int64
		if tg.reg != nil {
			before = tg.reg.Stats().BlobBytesOut
		}
		mid := sizes[1]
		got := make([]byte, mid)
		if _, err := f.ReadAt(got, begins[1]); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, file[begins[1]:begins[1]+int64(mid)]) {
			t.Fatal("the tensor read through the mount differs from the file")
		}
		if tg.reg == nil {
			return
		}
		time.Sleep(300 * time.Millisecond) // count readahead too
		st := tg.reg.Stats()
		fetched := st.BlobBytesOut - before
		// The tensor's chunks, the two edges, and nothing else.
		limit := int64(mid) + 2*edgeBytes
		t.Logf("%s: a tensor of %d bytes fetched %d bytes (%d blob GETs in all)", tg.name, mid, fetched, st.Requests["GET blob"])
		if fetched > limit {
			t.Fatalf("reading a tensor of %d bytes fetched %d bytes from %s, more than the tensor and two edges (%d)", mid, fetched, tg.name, limit)
		}
	})
}

// safetensorsFile returns a safetensors file holding tensors of the given
// sizes, with random contents from seed, and where each tensor starts.
func safetensorsFile(seed uint64, sizes ...int) ([]byte, []int64) {
	hdr := map[string]any{}
	off := 0
	for i, n := range sizes {
		hdr[fmt.Sprintf("t%d", i)] = map[string]any{"dtype": "U8", "shape": []int{n}, "data_offsets": []int{off, off + n}}
		off += n
	}
	h, _ := json.Marshal(hdr)
	for (8+len(h))%8 != 0 {
		h = append(h, ' ')
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	b = append(b, h...)
	data := make([]byte, off)
	r := rand.New(rand.NewPCG(seed, seed+1))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	begins := make([]int64, len(sizes))
	at := int64(len(b))
	for i, n := range sizes {
		begins[i] = at
		at += int64(n)
	}
	return append(b, data...), begins
}
