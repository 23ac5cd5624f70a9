// Package synth writes synthetic, deterministic LLaMA-shaped checkpoints in
// the Hugging Face safetensors layout, and "fine-tunes" them by rewriting a
// fraction of the tensors, for dedup tests and benchmarks.
//
// The files follow the real safetensors format: an 8-byte little-endian
// header length, a JSON header (with "__metadata__" first and the tensors in
// name order, padded with spaces to a multiple of 8 bytes), then the tensor
// data back to back in header order. Values are bf16 draws from N(0, 0.02²)
// (layer norms: around 1), so the bytes have the entropy of real weights.
package synth

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Options controls Generate. Zero values pick defaults.
type Options struct {
	// TargetBytes is the approximate total size of the tensor data over all
	// shards (default 20 MiB). The model's dimensions are chosen to hit it.
	TargetBytes int64
	// Shards is the number of .safetensors files (default 1).
	Shards int
	// Seed makes the output deterministic: the same options give the same
	// bytes.
	Seed uint64
	// Optional overrides of the model shape; zero means derived from
	// TargetBytes.
	Layers       int
	Hidden       int
	Intermediate int
	Vocab        int
	// TokenizerBytes is the approximate size of tokenizer.json (default
	// 48 KiB).
	TokenizerBytes int
}

// Tensor describes one tensor of a shard.
type Tensor struct {
	Name  string
	Shape []int64
	// Begin and End are the data offsets relative to the start of the data
	// section (as in the header).
	Begin, End int64
}

// Size is the tensor's byte length.
func (t Tensor) Size() int64 { return t.End - t.Begin }

// Shard is one parsed or planned .safetensors file.
type Shard struct {
	File     string
	Metadata map[string]string
	// Tensors in header (and data) order.
	Tensors []Tensor
	// HeaderLen is the length of the JSON header including padding; the
	// data section starts at 8+HeaderLen.
	HeaderLen int64
}

// DataStart is the file offset of the first tensor byte.
func (s *Shard) DataStart() int64 { return 8 + s.HeaderLen }

// Size is the file size.
func (s *Shard) Size() int64 {
	var n int64
	if len(s.Tensors) > 0 {
		n = s.Tensors[len(s.Tensors)-1].End
	}
	return s.DataStart() + n
}

// Model is the shape chosen for a checkpoint.
type Model struct {
	Layers, Hidden, Intermediate, Vocab int
}

const bf16 = 2

type tensorSpec struct {
	name  string
	shape []int64
	norm  bool
}

func (t tensorSpec) size() int64 {
	n := int64(bf16)
	for _, d := range t.shape {
		n *= d
	}
	return n
}

// ChooseModel picks dimensions for opts (see Options).
func ChooseModel(opts Options) Model {
	opts = opts.withDefaults()
	T := float64(opts.TargetBytes)
	m := Model{Layers: opts.Layers, Hidden: opts.Hidden, Intermediate: opts.Intermediate, Vocab: opts.Vocab}
	if m.Layers == 0 {
		// ~3 layers at 20 MiB, ~16 at 2 GiB, like small real models.
		m.Layers = int(math.Round(2*math.Log2(T/(1<<20)))) - 6
		if m.Layers < 2 {
			m.Layers = 2
		}
		if m.Layers < opts.Shards {
			m.Layers = opts.Shards
		}
	}
	if m.Hidden == 0 {
		// Per layer 4h² + 3hi with i≈8h/3 gives 12h² elements; vocab ≈ 8h
		// for embeddings and lm_head adds 16h².
		h := math.Sqrt(T / bf16 / float64(12*m.Layers+16))
		m.Hidden = max(64, int(h)/32*32)
	}
	h := m.Hidden
	if m.Intermediate == 0 {
		m.Intermediate = max(64, (8*h/3+31)/32*32)
	}
	if m.Vocab == 0 {
		rest := opts.TargetBytes - int64(m.Layers)*layerBytes(h, m.Intermediate) - int64(h*bf16)
		v := rest / int64(2*h*bf16)
		m.Vocab = int(max(int64(256), v/16*16))
	}
	return m
}

func layerBytes(h, i int) int64 {
	return bf16 * (4*int64(h)*int64(h) + 3*int64(h)*int64(i) + 2*int64(h))
}

func (o Options) withDefaults() Options {
	if o.TargetBytes <= 0 {
		o.TargetBytes = 20 << 20
	}
	if o.Shards <= 0 {
		o.Shards = 1
	}
	if o.TokenizerBytes <= 0 {
		o.TokenizerBytes = 48 << 10
	}
	return o
}

// specs lists the tensors in model order.
func (m Model) specs() []tensorSpec {
	h, i, v := int64(m.Hidden), int64(m.Intermediate), int64(m.Vocab)
	out := []tensorSpec{{name: "model.embed_tokens.weight", shape: []int64{v, h}}}
	for l := 0; l < m.Layers; l++ {
		p := "model.layers." + strconv.Itoa(l) + "."
		out = append(out,
			tensorSpec{p + "self_attn.q_proj.weight", []int64{h, h}, false},
			tensorSpec{p + "self_attn.k_proj.weight", []int64{h, h}, false},
			tensorSpec{p + "self_attn.v_proj.weight", []int64{h, h}, false},
			tensorSpec{p + "self_attn.o_proj.weight", []int64{h, h}, false},
			tensorSpec{p + "mlp.gate_proj.weight", []int64{i, h}, false},
			tensorSpec{p + "mlp.up_proj.weight", []int64{i, h}, false},
			tensorSpec{p + "mlp.down_proj.weight", []int64{h, i}, false},
			tensorSpec{p + "input_layernorm.weight", []int64{h}, true},
			tensorSpec{p + "post_attention_layernorm.weight", []int64{h}, true},
		)
	}
	out = append(out,
		tensorSpec{"model.norm.weight", []int64{h}, true},
		tensorSpec{"lm_head.weight", []int64{v, h}, false},
	)
	return out
}

// ShardName is the Hugging Face file name of shard i (0-based) of n.
func ShardName(i, n int) string {
	return fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, n)
}

// IndexName is the file mapping tensor names to shards.
const IndexName = "model.safetensors.index.json"

// Generate writes a synthetic checkpoint into dir (created if missing):
// config.json, tokenizer.json, the shards and model.safetensors.index.json.
func Generate(dir string, opts Options) error {
	opts = opts.withDefaults()
	m := ChooseModel(opts)
	specs := m.specs()
	if len(specs) < opts.Shards {
		return fmt.Errorf("synth: %d shards but only %d tensors", opts.Shards, len(specs))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	// Split in model order by cumulative size, like HF's max_shard_size.
	var total int64
	for _, s := range specs {
		total += s.size()
	}
	groups := make([][]tensorSpec, opts.Shards)
	var at int64
	for _, s := range specs {
		k := int((at + s.size()/2) * int64(opts.Shards) / total)
		k = min(k, opts.Shards-1)
		groups[k] = append(groups[k], s)
		at += s.size()
	}
	for k, g := range groups {
		if len(g) == 0 {
			return fmt.Errorf("synth: shard %d would be empty; use fewer shards or a larger size", k+1)
		}
	}

	weightMap := map[string]string{}
	jobs := make([]func() error, 0, opts.Shards)
	for k, g := range groups {
		file := ShardName(k, opts.Shards)
		var tensors []plannedTensor
		for _, s := range g {
			weightMap[s.name] = file
			tensors = append(tensors, plannedTensor{spec: s, src: genSource{seed: opts.Seed, tag: "init", norm: s.norm}})
		}
		path := filepath.Join(dir, file)
		jobs = append(jobs, func() error { return writeShard(path, tensors) })
	}
	if err := runParallel(jobs); err != nil {
		return err
	}

	if err := writeJSON(filepath.Join(dir, IndexName), indexFile{
		Metadata:  map[string]any{"total_size": total},
		WeightMap: weightMap,
	}); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(dir, "config.json"), m.config()); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tokenizer.json"), tokenizer(opts.Seed, opts.TokenizerBytes), 0o644)
}

type indexFile struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

func (m Model) config() map[string]any {
	return map[string]any{
		"architectures":           []string{"LlamaForCausalLM"},
		"model_type":              "llama",
		"hidden_size":             m.Hidden,
		"intermediate_size":       m.Intermediate,
		"num_hidden_layers":       m.Layers,
		"num_attention_heads":     max(1, m.Hidden/64),
		"num_key_value_heads":     max(1, m.Hidden/64),
		"vocab_size":              m.Vocab,
		"hidden_act":              "silu",
		"max_position_embeddings": 4096,
		"rms_norm_eps":            1e-05,
		"rope_theta":              10000.0,
		"tie_word_embeddings":     false,
		"torch_dtype":             "bfloat16",
		"transformers_version":    "4.44.0",
		"bos_token_id":            1,
		"eos_token_id":            2,
	}
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// tokenizer returns a tokenizer.json-like document of about n bytes.
func tokenizer(seed uint64, n int) []byte {
	r := newRNG(seed, "tokenizer")
	const letters = "abcdefghijklmnopqrstuvwxyz"
	var b bytes.Buffer
	b.WriteString(`{"version":"1.0","truncation":null,"padding":null,"added_tokens":[` +
		`{"id":0,"content":"<unk>","special":true},{"id":1,"content":"<s>","special":true},` +
		`{"id":2,"content":"</s>","special":true}],"normalizer":null,` +
		`"pre_tokenizer":{"type":"Metaspace","replacement":"▁"},` +
		`"model":{"type":"BPE","dropout":null,"unk_token":"<unk>","vocab":{`)
	seen := map[string]bool{}
	var words []string
	for id := 3; b.Len() < n*2/3; id++ {
		var w []byte
		if r.intn(3) == 0 {
			w = append(w, "▁"...)
		}
		for l := 1 + r.intn(8); l > 0; l-- {
			w = append(w, letters[r.intn(len(letters))])
		}
		if seen[string(w)] {
			continue
		}
		seen[string(w)] = true
		words = append(words, string(w))
		if id > 3 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:%d", w, id)
	}
	b.WriteString(`},"merges":[`)
	for k := 0; b.Len() < n; k++ {
		if k > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q", words[r.intn(len(words))]+" "+words[r.intn(len(words))])
	}
	b.WriteString("]}}\n")
	return b.Bytes()
}

// runParallel runs jobs on up to GOMAXPROCS goroutines and returns the first
// error.
func runParallel(jobs []func() error) error {
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	errs := make([]error, len(jobs))
	for k, job := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[k] = job()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// header renders a safetensors header for tensors in the given order and
// fills in their offsets. The result is padded with spaces to a multiple of
// 8 bytes.
func header(meta map[string]string, tensors []Tensor) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	if meta != nil {
		b.WriteString(`"__metadata__":`)
		mb, _ := json.Marshal(meta)
		b.Write(mb)
	}
	var off int64
	for k := range tensors {
		t := &tensors[k]
		size := int64(bf16)
		for _, d := range t.Shape {
			size *= d
		}
		t.Begin, t.End = off, off+size
		off += size
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		nb, _ := json.Marshal(t.Name)
		b.Write(nb)
		b.WriteString(`:{"dtype":"BF16","shape":[`)
		for j, d := range t.Shape {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatInt(d, 10))
		}
		fmt.Fprintf(&b, `],"data_offsets":[%d,%d]}`, t.Begin, t.End)
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	return b.Bytes()
}

// ReadShard parses the header of a .safetensors file.
func ReadShard(path string) (*Shard, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lb [8]byte
	if _, err := f.ReadAt(lb[:], 0); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	n := binary.LittleEndian.Uint64(lb[:])
	if n > 100<<20 {
		return nil, fmt.Errorf("%s: header length %d too large", path, n)
	}
	hb := make([]byte, n)
	if _, err := f.ReadAt(hb, 8); err != nil {
		return nil, fmt.Errorf("%s: header: %w", path, err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hb, &raw); err != nil {
		return nil, fmt.Errorf("%s: header: %w", path, err)
	}
	s := &Shard{File: filepath.Base(path), HeaderLen: int64(n)}
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &s.Metadata); err != nil {
				return nil, fmt.Errorf("%s: metadata: %w", path, err)
			}
			continue
		}
		var ti struct {
			Dtype       string   `json:"dtype"`
			Shape       []int64  `json:"shape"`
			DataOffsets [2]int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &ti); err != nil {
			return nil, fmt.Errorf("%s: tensor %s: %w", path, name, err)
		}
		if ti.Dtype != "BF16" {
			return nil, fmt.Errorf("%s: tensor %s: dtype %s not supported", path, name, ti.Dtype)
		}
		s.Tensors = append(s.Tensors, Tensor{Name: name, Shape: ti.Shape, Begin: ti.DataOffsets[0], End: ti.DataOffsets[1]})
	}
	sort.Slice(s.Tensors, func(a, b int) bool { return s.Tensors[a].Begin < s.Tensors[b].Begin })
	return s, nil
}

// isNorm reports whether a tensor name is a norm weight (values near 1).
func isNorm(name string) bool {
	return strings.HasSuffix(name, "norm.weight")
}
