package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// TestGGUFFineTune pushes a generated GGUF checkpoint and a fine-tune of it
// (three tensors of different types changed) with the real CLI: the second
// push uploads within 1.05x of the changed tensors' bytes, and diff
// --tensors names exactly the changed tensors, none undecided.
func TestGGUFFineTune(t *testing.T) {
	reg := newDistribution(t)
	repo := reg.Host + "/models/gguf"
	tuned := map[string]bool{"blk.1.attn_q.weight": true, "blk.2.ffn_up.weight": true, "blk.3.attn_norm.weight": true}
	base := synth.GGUFOptions{Blocks: 4, Hidden: 1024, Seed: 29}
	ft := base
	ft.Tuned = func(name string) bool { return tuned[name] }
	var changed int64
	for _, x := range base.GGUFTensors() {
		if tuned[x.Name] {
			changed += x.Bytes
		}
	}
	v1, v2 := filepath.Join(t.TempDir(), "v1"), filepath.Join(t.TempDir(), "v2")
	for dir, o := range map[string]synth.GGUFOptions{v1: base, v2: ft} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := synth.WriteGGUF(filepath.Join(dir, "model.gguf"), o); err != nil {
			t.Fatal(err)
		}
	}
	a := dedupPushJSON(t, repo+":v1", v1)
	b := dedupPushJSON(t, repo+":v2", v2)
	ratio := float64(b.BytesUploaded) / float64(changed)
	t.Logf("GGUF %d bytes in %d chunks; fine-tune changed %d tensor bytes, re-push uploaded %d bytes in %d chunks (%.3fx); dedup %.1f%%",
		a.Bytes, b.Chunks, changed, b.BytesUploaded, b.ChunksUploaded, ratio, 100*(1-float64(b.BytesUploaded)/float64(b.Bytes)))
	if ratio > 1.05 {
		t.Errorf("re-push uploaded %d bytes, %.3fx the %d changed tensor bytes: want at most 1.05x", b.BytesUploaded, ratio, changed)
	}

	res := mustRun(t, "diff", "--tensors", "--json", repo+":v1", repo+":v2")
	var d struct {
		Files   []string `json:"files"`
		Changed []struct {
			Name  string   `json:"name"`
			Dtype string   `json:"dtype"`
			What  []string `json:"what"`
		} `json:"changed"`
		Undecided []struct{ Name string } `json:"undecided"`
		Unchanged int                     `json:"unchanged"`
	}
	mustJSON(t, []byte(res.stdout), &d)
	var names []string
	for _, c := range d.Changed {
		names = append(names, c.Name)
		if !slices.Equal(c.What, []string{"bytes"}) {
			t.Errorf("%s changed %v, want bytes", c.Name, c.What)
		}
	}
	slices.Sort(names)
	want := []string{"blk.1.attn_q.weight", "blk.2.ffn_up.weight", "blk.3.attn_norm.weight"}
	if !slices.Equal(d.Files, []string{"model.gguf"}) || !slices.Equal(names, want) || len(d.Undecided) != 0 ||
		d.Unchanged != len(base.GGUFTensors())-3 {
		t.Errorf("diff --tensors: files %v, changed %v, undecided %v, %d unchanged; want %v changed", d.Files, names, d.Undecided, d.Unchanged, want)
	}
}

// TestGGUFMountOneTensor mounts a pushed GGUF checkpoint and reads one
// tensor from its middle through real FUSE. With the default --prefetch
// headers the mount has fetched the header's chunk before the read, so
// the read fetches no header bytes (and at most three requests: the
// tensor and the neighbouring edges or small chunks); with --prefetch none
// the same read has to fetch the header first.
func TestGGUFMountOneTensor(t *testing.T) {
	requireFUSE(t)
	reg := newDistribution(t)
	o := synth.GGUFOptions{Blocks: 4, Hidden: 1024, Seed: 7}
	dir := t.TempDir()
	p := filepath.Join(dir, "model.gguf")
	if err := synth.WriteGGUF(p, o); err != nil {
		t.Fatal(err)
	}
	b := fileContents(t, p)
	dataStart, offs := o.GGUFLayout()
	hdrChunk := digestOf(b[:dataStart]) // the chunk push cuts at the header's end
	const k = 11                        // blk.2.attn_k.weight
	x := o.GGUFTensors()[k]
	want := b[offs[k] : offs[k]+x.Bytes]
	ref := mustRun(t, "push", reg.Host+"/models/gguf:v1", dir).lastLine()

	for _, c := range []struct {
		prefetch   string
		headerRead bool
	}{{"headers", false}, {"none", true}} {
		t.Run(c.prefetch, func(t *testing.T) {
			reg.ResetStats()
			mp := mount(t, ref, "--prefetch", c.prefetch)
			reg.Settle(t)
			open := reg.Stats()
			reg.ResetStats()
			f, err := os.Open(filepath.Join(mp, "model.gguf"))
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(want))
			_, err = f.ReadAt(got, offs[k])
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s read through the mount differs", x.Name)
			}
			reg.Settle(t)
			st := reg.Stats()
			t.Logf("--prefetch %s: the open fetched the header chunk %d times; one tensor of %d bytes: %d requests (%v), %d blob bytes (%.3fx), header chunk %d times",
				c.prefetch, open.BlobGets[hdrChunk], x.Bytes, total(st.Requests), st.Requests, st.BlobBytesOut, float64(st.BlobBytesOut)/float64(x.Bytes), st.BlobGets[hdrChunk])
			if read := st.BlobGets[hdrChunk] > 0; read != c.headerRead {
				t.Errorf("--prefetch %s: the tensor read fetched the header chunk: %v, want %v", c.prefetch, read, c.headerRead)
			}
			if !c.headerRead {
				if open.BlobGets[hdrChunk] != 1 {
					t.Errorf("the header prefetch fetched the header chunk %d times, want once", open.BlobGets[hdrChunk])
				}
				if n := total(st.Requests); n > 3 {
					t.Errorf("reading one tensor took %d requests, want at most 3: %v", n, st.Requests)
				}
			}
		})
	}
}
