package modelpack

import (
	"bytes"
	"cmp"
	"encoding/json"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

// Config is the ModelPack config object (docs/config.md of the spec), the
// fields bdnvol writes.
type Config struct {
	Descriptor ConfigDescriptor `json:"descriptor"`
	Config     ModelConfig      `json:"config"`
	ModelFS    ModelFS          `json:"modelfs"`
}

// ConfigDescriptor is the config's general information about the model.
type ConfigDescriptor struct {
	Family   string `json:"family,omitempty"`
	Revision string `json:"revision,omitempty"` // the version's digest
}

// ModelConfig is the config's technical metadata.
type ModelConfig struct {
	Architecture string `json:"architecture,omitempty"`
	Format       string `json:"format,omitempty"`
	ParamSize    string `json:"paramSize,omitempty"`
	Precision    string `json:"precision,omitempty"`
	Quantization string `json:"quantization,omitempty"`
}

// ModelFS lists the layers' uncompressed digests.
type ModelFS struct {
	Type    string   `json:"type"` // "layers"
	DiffIDs []string `json:"diffIds"`
}

// safetensors dtypes as the spec's precision names.
var safetensorsPrecision = map[string]string{
	"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
	"F8_E4M3": "float8_e4m3", "F8_E5M2": "float8_e5m2",
	"I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
	"U8": "uint8", "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
}

// ggml types that are a plain precision; the others are quantizations.
var ggufPrecision = map[string]string{
	"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
	"I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
}

// facts is what the weight files of a version say, gathered file by file.
type facts struct {
	formats      map[string]bool
	precision    map[string]int64 // bytes per precision
	quantization map[string]int64
	params       uint64
	paramsKnown  bool
	arch, family string
}

func newFacts() *facts {
	return &facts{formats: map[string]bool{}, precision: map[string]int64{}, quantization: map[string]int64{}, paramsKnown: true}
}

// add reads what the start of file p (size bytes; prefix holds its first
// bytes) says: a config.json at the root, a safetensors or GGUF header. A
// weight file whose header does not read leaves the parameter count
// unknown.
func (x *facts) add(p string, size int64, prefix []byte) {
	r := bytes.NewReader(prefix)
	switch {
	case p == "config.json":
		var c struct {
			Architectures []string `json:"architectures"`
			ModelType     string   `json:"model_type"`
		}
		if json.Unmarshal(prefix, &c) == nil {
			if len(c.Architectures) > 0 {
				x.arch = "transformer" // a transformers model, as modctl names it
			}
			x.family = c.ModelType
		}
	case tensorheader.IsSafetensors(p):
		x.formats["safetensors"] = true
		hdr, err := tensorheader.ReadSafetensorsHeaderBytes(r, size, tensorheader.SafetensorsHeaderLimit)
		if err != nil {
			x.paramsKnown = false
			return
		}
		x.addSafetensors(hdr)
	case tensorheader.IsGGUF(p):
		x.formats["gguf"] = true
		h, err := tensorheader.ReadGGUFHeader(r, size, tensorheader.GGUFHeaderLimit)
		if err != nil {
			x.paramsKnown = false
			return
		}
		if x.arch == "" {
			x.arch = h.Architecture
		}
		for _, t := range h.Tensors {
			x.params += t.Elements()
			if p, ok := ggufPrecision[t.Dtype()]; ok {
				x.precision[p] += t.End - t.Begin
			} else {
				x.quantization[t.Dtype()] += t.End - t.Begin
			}
		}
	case isWeight(p):
		x.paramsKnown = false
	}
}

func (x *facts) addSafetensors(hdr []byte) {
	var raw map[string]json.RawMessage
	if json.Unmarshal(hdr, &raw) != nil {
		x.paramsKnown = false
		return
	}
	for name, msg := range raw {
		if name == "__metadata__" {
			continue
		}
		var t struct {
			Dtype   string   `json:"dtype"`
			Shape   []uint64 `json:"shape"`
			Offsets []int64  `json:"data_offsets"`
		}
		if json.Unmarshal(msg, &t) != nil || len(t.Offsets) != 2 {
			x.paramsKnown = false
			continue
		}
		n := uint64(1)
		for _, d := range t.Shape {
			n *= d
		}
		x.params += n
		p, ok := safetensorsPrecision[t.Dtype]
		if !ok {
			p = strings.ToLower(t.Dtype)
		}
		x.precision[p] += t.Offsets[1] - t.Offsets[0]
	}
}

// config returns the config's technical part.
func (x *facts) config() ModelConfig {
	c := ModelConfig{Architecture: x.arch, Precision: byBytes(x.precision), Quantization: byBytes(x.quantization)}
	var fs []string
	for f := range x.formats {
		fs = append(fs, f)
	}
	slices.Sort(fs)
	c.Format = strings.Join(fs, ",")
	if x.paramsKnown && x.params > 0 {
		c.ParamSize = ParamSize(x.params)
	}
	return c
}

// byBytes joins the keys of m with commas, most bytes first.
func byBytes(m map[string]int64) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b string) int {
		return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b))
	})
	return strings.Join(ks, ",")
}

// ParamSize writes a parameter count as the spec's paramSize: a count with
// one decimal and a scale letter (K, M, B, T, Q), "6.7B".
func ParamSize(n uint64) string {
	scales := []struct {
		letter string
		of     float64
	}{{"Q", 1e15}, {"T", 1e12}, {"B", 1e9}, {"M", 1e6}, {"K", 1e3}}
	for _, s := range scales {
		if float64(n) >= s.of || s.letter == "K" {
			return strconv.FormatFloat(float64(n)/s.of, 'f', 1, 64) + s.letter
		}
	}
	return ""
}

// weightSuffixes name weight files of the common formats.
var weightSuffixes = []string{".safetensors", ".gguf", ".bin", ".pt", ".pth", ".ckpt", ".onnx", ".h5", ".msgpack", ".pb", ".tflite", ".mlmodel", ".npz", ".nemo"}

func isWeight(p string) bool {
	return slices.ContainsFunc(weightSuffixes, func(s string) bool { return strings.HasSuffix(p, s) })
}

// KindOf is the layer kind export gives the file at path p: weights by
// their suffix, documentation (README, LICENSE, *.md), code (*.py, *.sh,
// ...), and everything else (config.json, tokenizer files) as weight
// config.
func KindOf(p string) Kind {
	base := strings.ToLower(path.Base(p))
	switch {
	case isWeight(base):
		return KindWeight
	case strings.HasPrefix(base, "readme"), strings.HasPrefix(base, "license"), strings.HasPrefix(base, "notice"),
		strings.HasSuffix(base, ".md"), strings.HasSuffix(base, ".rst"):
		return KindDoc
	case strings.HasSuffix(base, ".py"), strings.HasSuffix(base, ".sh"), strings.HasSuffix(base, ".ipynb"),
		strings.HasSuffix(base, ".js"), strings.HasSuffix(base, ".go"):
		return KindCode
	}
	return KindWeightConfig
}
