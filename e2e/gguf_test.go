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
