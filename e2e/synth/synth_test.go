package synth_test

import (
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// parsed is what the independent parser below extracts from a file.
type parsed struct {
	headerLen int
	names     []string // in header key order
	meta      map[string]string
	tensors   map[string]tensorInfo
	data      []byte
}

type tensorInfo struct {
	Dtype       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// parseSafetensors checks a file against the safetensors format, written
// from the spec without using package synth.
func parseSafetensors(t *testing.T, path string) parsed {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 8 {
		t.Fatalf("%s: too short", path)
	}
	n := binary.LittleEndian.Uint64(b[:8])
	if n == 0 || 8+n > uint64(len(b)) {
		t.Fatalf("%s: header length %d, file %d", path, n, len(b))
	}
	if (8+n)%8 != 0 {
		t.Errorf("%s: data section starts at %d, not 8-aligned", path, 8+n)
	}
	hdr := b[8 : 8+n]
	if hdr[0] != '{' {
		t.Fatalf("%s: header does not start with '{'", path)
	}
	trimmed := bytes.TrimRight(hdr, " ")
	if trimmed[len(trimmed)-1] != '}' {
		t.Fatalf("%s: header padding is not spaces", path)
	}
	p := parsed{headerLen: int(n), tensors: map[string]tensorInfo{}, data: b[8+n:]}

	// Walk the keys in order.
	dec := json.NewDecoder(bytes.NewReader(hdr))
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		key := tok.(string)
		if key == "__metadata__" {
			if len(p.names) > 0 {
				t.Errorf("%s: __metadata__ not first", path)
			}
			if err := dec.Decode(&p.meta); err != nil {
				t.Fatalf("%s: metadata: %v", path, err)
			}
			continue
		}
		var ti tensorInfo
		if err := dec.Decode(&ti); err != nil {
			t.Fatalf("%s: %s: %v", path, key, err)
		}
		if _, dup := p.tensors[key]; dup {
			t.Errorf("%s: duplicate tensor %s", path, key)
		}
		p.names = append(p.names, key)
		p.tensors[key] = ti
	}
	if p.meta["format"] != "pt" {
		t.Errorf("%s: metadata %v", path, p.meta)
	}
	if !sort.StringsAreSorted(p.names) {
		t.Errorf("%s: tensors not sorted by name: %v", path, p.names)
	}
	// Back to back, in header order, covering the whole data section.
	var off int64
	for _, name := range p.names {
		ti := p.tensors[name]
		if ti.Dtype != "BF16" {
			t.Errorf("%s: %s dtype %s", path, name, ti.Dtype)
		}
		elems := int64(1)
		for _, d := range ti.Shape {
			elems *= d
		}
		if ti.DataOffsets[0] != off || ti.DataOffsets[1]-ti.DataOffsets[0] != 2*elems {
			t.Errorf("%s: %s offsets %v, want [%d,%d]", path, name, ti.DataOffsets, off, off+2*elems)
		}
		off = ti.DataOffsets[1]
	}
	if off != int64(len(p.data)) {
		t.Errorf("%s: tensors end at %d, data section is %d bytes", path, off, len(p.data))
	}
	return p
}

func (p parsed) tensor(name string) []byte {
	ti := p.tensors[name]
	return p.data[ti.DataOffsets[0]:ti.DataOffsets[1]]
}

func readIndex(t *testing.T, dir string) (map[string]string, int64) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var idx struct {
		Metadata struct {
			TotalSize int64 `json:"total_size"`
		} `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatal(err)
	}
	return idx.WeightMap, idx.Metadata.TotalSize
}

// checkDir validates every shard and the index of a checkpoint.
func checkDir(t *testing.T, dir string, shards int) map[string]parsed {
	t.Helper()
	weightMap, totalSize := readIndex(t, dir)
	out := map[string]parsed{}
	var total int64
	seen := map[string]string{}
	for i := 1; i <= shards; i++ {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i, shards)
		p := parseSafetensors(t, filepath.Join(dir, name))
		out[name] = p
		total += int64(len(p.data))
		for _, tn := range p.names {
			seen[tn] = name
		}
	}
	if total != totalSize {
		t.Errorf("index total_size %d, tensors hold %d", totalSize, total)
	}
	if len(seen) != len(weightMap) {
		t.Errorf("index has %d tensors, shards %d", len(weightMap), len(seen))
	}
	for tn, f := range weightMap {
		if seen[tn] != f {
			t.Errorf("index maps %s to %s, found in %q", tn, f, seen[tn])
		}
	}
	for _, f := range []string{"config.json", "tokenizer.json"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid(b) {
			t.Errorf("%s is not valid JSON", f)
		}
	}
	return out
}

func hashDir(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][32]byte{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = sha256.Sum256(b)
	}
	return out
}

func TestGenerateValid(t *testing.T) {
	dir := t.TempDir()
	const target = 20 << 20
	if err := synth.Generate(dir, synth.Options{TargetBytes: target, Shards: 3, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	shards := checkDir(t, dir, 3)
	var total int64
	names := map[string]bool{}
	for _, p := range shards {
		total += int64(len(p.data))
		for _, n := range p.names {
			names[n] = true
		}
	}
	if total < target*9/10 || total > target*11/10 {
		t.Errorf("tensor bytes %d, want about %d", total, target)
	}
	for _, want := range []string{
		"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
		"model.layers.0.input_layernorm.weight", "model.layers.0.mlp.down_proj.weight",
		"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
		"model.layers.0.post_attention_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
		"model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
		"model.layers.0.self_attn.o_proj.weight",
	} {
		if !names[want] {
			t.Errorf("missing tensor %s", want)
		}
	}

	// Values look like weights: finite bf16, small, mean near 0, std near
	// 0.02; compressible a little but not much.
	p := shards["model-00002-of-00003.safetensors"]
	var name string
	for _, n := range p.names {
		if strings.HasSuffix(n, "mlp.up_proj.weight") {
			name = n
		}
	}
	if name == "" {
		t.Fatalf("no up_proj in shard 2: %v", p.names)
	}
	data := p.tensor(name)
	var sum, sq float64
	for i := 0; i < len(data); i += 2 {
		v := float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(data[i:])) << 16))
		if math.IsNaN(v) || math.Abs(v) > 0.2 {
			t.Fatalf("%s: value %v", name, v)
		}
		sum += v
		sq += v * v
	}
	n := float64(len(data) / 2)
	mean, std := sum/n, math.Sqrt(sq/n-(sum/n)*(sum/n))
	if math.Abs(mean) > 0.001 || std < 0.017 || std > 0.023 {
		t.Errorf("%s: mean %v std %v", name, mean, std)
	}
	var cb bytes.Buffer
	w, _ := flate.NewWriter(&cb, flate.BestSpeed)
	w.Write(data)
	w.Close()
	ratio := float64(cb.Len()) / float64(len(data))
	if ratio < 0.5 || ratio > 0.99 {
		t.Errorf("%s: deflate ratio %.3f, want bf16-like entropy", name, ratio)
	}
	t.Logf("model %+v, deflate ratio %.3f, std %.4f", synth.ChooseModel(synth.Options{TargetBytes: target, Shards: 3}), ratio, std)
}

func TestGenerateDeterministic(t *testing.T) {
	a, b, c := t.TempDir(), t.TempDir(), t.TempDir()
	opts := synth.Options{TargetBytes: 4 << 20, Shards: 2, Seed: 42}
	for _, d := range []string{a, b} {
		if err := synth.Generate(d, opts); err != nil {
			t.Fatal(err)
		}
	}
	opts.Seed = 43
	if err := synth.Generate(c, opts); err != nil {
		t.Fatal(err)
	}
	ha, hb, hc := hashDir(t, a), hashDir(t, b), hashDir(t, c)
	if len(ha) != 5 {
		t.Errorf("got %d files, want 5", len(ha))
	}
	for f := range ha {
		if ha[f] != hb[f] {
			t.Errorf("%s differs between runs with the same seed", f)
		}
		if strings.HasSuffix(f, ".safetensors") && ha[f] == hc[f] {
			t.Errorf("%s identical for different seeds", f)
		}
	}
}

func TestFineTune(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "ft")
	if err := synth.Generate(src, synth.Options{TargetBytes: 24 << 20, Shards: 3, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	before := hashDir(t, src)
	rep, err := synth.FineTune(src, dst, synth.FineTuneOptions{Fraction: 0.3, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	if after := hashDir(t, src); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatal("FineTune modified its source")
	}
	a, b := checkDir(t, src, 3), checkDir(t, dst, 3)

	// Compare tensor by tensor.
	var srcBytes, changed, added, total int64
	var changedNames []string
	srcTensors := map[string][]byte{}
	for _, p := range a {
		for _, n := range p.names {
			srcTensors[n] = p.tensor(n)
			srcBytes += int64(len(p.tensor(n)))
		}
	}
	shifted := 0
	for file, p := range b {
		for _, n := range p.names {
			d := p.tensor(n)
			total += int64(len(d))
			s, ok := srcTensors[n]
			switch {
			case !ok:
				added += int64(len(d))
				if n != rep.NewTensor || file != rep.NewTensorShard {
					t.Errorf("unexpected new tensor %s in %s", n, file)
				}
			case !bytes.Equal(s, d):
				if len(s) != len(d) {
					t.Errorf("%s changed size", n)
				}
				changed += int64(len(d))
				changedNames = append(changedNames, n)
			}
			if ok && file == rep.NewTensorShard && p.tensors[n].DataOffsets != a[file].tensors[n].DataOffsets {
				shifted++
			}
		}
	}
	sort.Strings(changedNames)
	if fmt.Sprint(changedNames) != fmt.Sprint(rep.ChangedTensors) {
		t.Errorf("changed tensors %v, report says %v", changedNames, rep.ChangedTensors)
	}
	if changed != rep.ChangedTensorBytes || added != rep.NewTensorBytes || total != rep.TensorBytes {
		t.Errorf("measured changed=%d new=%d total=%d, report %+v", changed, added, total, rep)
	}
	if added == 0 || shifted == 0 {
		t.Errorf("new tensor %d bytes, %d tensors shifted; want both > 0", added, shifted)
	}
	frac := float64(changed) / float64(srcBytes)
	if frac < 0.25 || frac > 0.30 {
		t.Errorf("changed fraction %.3f, want about 0.30", frac)
	}
	if rep.ChangedHeaderBytes == 0 || rep.ChangedHeaderBytes >= rep.HeaderBytes {
		t.Errorf("header bytes %d changed of %d; want only the shard with the new tensor", rep.ChangedHeaderBytes, rep.HeaderBytes)
	}
	if fmt.Sprint(rep.ChangedFiles) != "[model.safetensors.index.json]" {
		t.Errorf("changed files %v", rep.ChangedFiles)
	}
	t.Logf("fine-tune: %d/%d tensor bytes rewritten (%.3f), %d new, headers %d (%d changed)",
		changed, srcBytes, frac, added, rep.HeaderBytes, rep.ChangedHeaderBytes)

	// Deterministic too.
	dst2 := filepath.Join(t.TempDir(), "ft")
	if _, err := synth.FineTune(src, dst2, synth.FineTuneOptions{Fraction: 0.3, Seed: 5}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(hashDir(t, dst)) != fmt.Sprint(hashDir(t, dst2)) {
		t.Error("FineTune not deterministic")
	}
}

func BenchmarkGenerate(b *testing.B) {
	const size = 256 << 20
	b.SetBytes(size)
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		if err := synth.Generate(dir, synth.Options{TargetBytes: size, Shards: 2, Seed: uint64(i)}); err != nil {
			b.Fatal(err)
		}
	}
}
