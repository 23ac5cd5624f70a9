// Command enginestub stands in for an inference engine's start (no GPU
// here): it computes its compile-cache key from its configuration and
// environment, as vLLM does (a hash of the factors that change compiled
// code, the cache under $CACHE_ROOT/<hash>/rank_<r>/), and loads the cache
// it finds there or "compiles": burns CPU for -compile-time and writes
// files shaped like torch.compile's and Triton's caches (many small
// files, a few large ones), with a manifest written last.
//
//	enginestub -cache-root DIR -tp 2 -rank 0 [-compile-time 2s]
//	enginestub -print-key ...   # the warm-state key, k=v,...
//
// It prints one JSON line: {"mode":"compiled"|"loaded", ...}.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// engineVersion stands in for the engine's and compiler's versions, which
// vLLM hashes with the configuration.
const engineVersion = "enginestub-1"

type config struct {
	Model       string `json:"model"`
	EngineImage string `json:"engine_image"`
	GPU         string `json:"gpu"`
	CC          string `json:"cc"`
	Driver      string `json:"driver"`
	TP          int    `json:"tp"`
	PP          int    `json:"pp"`
	DP          int    `json:"dp"`
	EP          int    `json:"ep"`
	Rank        int    `json:"rank"`
	DType       string `json:"dtype"`
	Quant       string `json:"quant"`
	// CompileLevel stands in for the environment variables that change
	// compiled code (vLLM hashes those it knows: VLLM_* compile settings).
	CompileLevel string `json:"compile_level"`
}

// factorsHash is the hash of what changes compiled code: the engine,
// the model, the parallel layout, dtype, quantisation, the GPU's compute
// capability and the compile settings. Not the rank (each rank has its
// own directory under the hash), not the host, the pod IP or the home
// directory.
func factorsHash(c config) (string, []byte) {
	f := map[string]any{
		"engine": engineVersion, "model": c.Model, "tp": c.TP, "pp": c.PP, "dp": c.DP, "ep": c.EP,
		"dtype": c.DType, "quant": c.Quant, "cc": c.CC, "compile_level": c.CompileLevel,
	}
	b, _ := json.Marshal(f) // map keys sorted: deterministic
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])[:10], b
}

// key is the warm-state key of this start, in bdnvol's k=v form.
func key(c config, hash string) string {
	kv := map[string]string{
		"engine": "enginestub", "engine-image": c.EngineImage, "gpu": c.GPU, "cc": c.CC, "driver": c.Driver,
		"tp": fmt.Sprint(c.TP), "pp": fmt.Sprint(c.PP), "dp": fmt.Sprint(c.DP), "ep": fmt.Sprint(c.EP),
		"rank": fmt.Sprint(c.Rank), "dtype": c.DType, "quant": c.Quant, "compile-hash": hash,
	}
	var parts []string
	for k, v := range kv {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

type entry struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	Sum  string `json:"sha256"`
}

const manifestName = "cache_manifest.json"

func main() {
	var c config
	root := flag.String("cache-root", os.Getenv("CACHE_ROOT"), "cache root ($CACHE_ROOT)")
	flag.StringVar(&c.Model, "model", "stub-model", "model name")
	flag.StringVar(&c.EngineImage, "engine-image", "sha256:"+strings.Repeat("e", 64), "engine image digest")
	flag.StringVar(&c.GPU, "gpu", "NVIDIA-H100-80GB-HBM3", "GPU model")
	flag.StringVar(&c.CC, "cc", "9.0", "compute capability")
	flag.StringVar(&c.Driver, "driver", "550", "driver major")
	flag.IntVar(&c.TP, "tp", 1, "tensor-parallel size")
	flag.IntVar(&c.PP, "pp", 1, "pipeline-parallel size")
	flag.IntVar(&c.DP, "dp", 1, "data-parallel size")
	flag.IntVar(&c.EP, "ep", 1, "expert-parallel size")
	flag.IntVar(&c.Rank, "rank", 0, "rank")
	flag.StringVar(&c.DType, "dtype", "bf16", "dtype")
	flag.StringVar(&c.Quant, "quant", "none", "quantisation")
	compileTime := flag.Duration("compile-time", 2*time.Second, "CPU time a compile burns")
	small := flag.Int("small-files", 300, "small files a compile writes")
	large := flag.Int("large-files", 3, "large files a compile writes")
	largeSize := flag.Int64("large-size", 8<<20, "bytes of each large file")
	printKey := flag.Bool("print-key", false, "print the warm-state key and exit")
	flag.Parse()
	c.CompileLevel = os.Getenv("STUB_COMPILE_LEVEL")
	hash, factors := factorsHash(c)
	if *printKey {
		fmt.Println(key(c, hash))
		return
	}
	if *root == "" {
		fail(errors.New("no -cache-root or $CACHE_ROOT"))
	}
	dir := filepath.Join(*root, hash, fmt.Sprintf("rank_%d", c.Rank))
	start := time.Now()
	mode := "loaded"
	n, bytes, err := load(dir)
	if err != nil {
		mode = "compiled"
		n, bytes, err = compile(dir, c, factors, *compileTime, *small, *large, *largeSize)
	}
	if err != nil {
		fail(err)
	}
	out, _ := json.Marshal(map[string]any{
		"mode": mode, "hash": hash, "dir": dir, "files": n, "bytes": bytes,
		"seconds": time.Since(start).Seconds(), "key": key(c, hash),
	})
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "enginestub:", err)
	os.Exit(1)
}

// load reads the cache in dir whole, checking each file against the
// manifest; any difference is a miss.
func load(dir string) (int, int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return 0, 0, err
	}
	var es []entry
	if err := json.Unmarshal(b, &es); err != nil {
		return 0, 0, err
	}
	var total int64
	for _, e := range es {
		f, err := os.Open(filepath.Join(dir, filepath.FromSlash(e.Path)))
		if err != nil {
			return 0, 0, err
		}
		h := sha256.New()
		n, err := io.Copy(h, f)
		f.Close()
		if err != nil {
			return 0, 0, err
		}
		if n != e.Size || hex.EncodeToString(h.Sum(nil)) != e.Sum {
			return 0, 0, fmt.Errorf("%s: not what the manifest says", e.Path)
		}
		total += n
	}
	return len(es), total, nil
}

// compile burns CPU, then writes the cache: small per-rank files (the
// inductor's generated code), large files shared by every rank (Triton
// kernels), one file that differs on each compile (compiles are not
// byte-reproducible), the factors, and the manifest last.
func compile(dir string, c config, factors []byte, burn time.Duration, small, large int, largeSize int64) (int, int64, error) {
	deadline := time.Now().Add(burn)
	h := sha256.Sum256(factors)
	for time.Now().Before(deadline) {
		for range 10000 {
			h = sha256.Sum256(h[:])
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, 0, err
	}
	var es []entry
	write := func(rel string, b []byte) error {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
		s := sha256.Sum256(b)
		es = append(es, entry{Path: rel, Size: int64(len(b)), Sum: hex.EncodeToString(s[:])})
		return nil
	}
	seed := sha256.Sum256(factors)
	for i := range small {
		r := rand.New(rand.NewPCG(uint64(i), uint64(c.Rank)+uint64(seed[0])))
		b := make([]byte, 1024+r.IntN(7*1024))
		for j := range b {
			b[j] = "abcdefghijklmnopqrstuvwxyz_()=+\n "[r.IntN(33)]
		}
		if err := write(fmt.Sprintf("inductor_cache/%02x/c%04d.py", i%64, i), b); err != nil {
			return 0, 0, err
		}
	}
	for i := range large {
		r := rand.New(rand.NewPCG(uint64(i)+1000, uint64(seed[1])))
		b := make([]byte, largeSize)
		for j := 0; j+8 <= len(b); j += 8 {
			v := r.Uint64()
			for k := range 8 {
				b[j+k] = byte(v >> (8 * k))
			}
		}
		if err := write(fmt.Sprintf("triton_cache/k%d/kernel.cubin", i), b); err != nil {
			return 0, 0, err
		}
	}
	if err := write("compiled_at", []byte(time.Now().UTC().Format(time.RFC3339Nano)+"\n")); err != nil {
		return 0, 0, err
	}
	if err := write("cache_key_factors.json", factors); err != nil {
		return 0, 0, err
	}
	mb, _ := json.Marshal(es)
	if err := os.WriteFile(filepath.Join(dir, manifestName), mb, 0o644); err != nil {
		return 0, 0, err
	}
	var total int64
	for _, e := range es {
		total += e.Size
	}
	return len(es), total, nil
}
