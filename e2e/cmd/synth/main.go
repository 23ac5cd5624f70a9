// Command synth writes synthetic safetensors checkpoints for tests and
// benchmarks.
//
//	synth -out DIR -size 2GiB -shards 4 -seed 1
//	synth -finetune SRC -out DST -fraction 0.3 [-seed 2]
//	synth -perturb SRC -out DST -fraction 0.02 [-relative 0.05] [-replace TENSOR]
//
// With -finetune it prints the fine-tune report as JSON on stdout.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

func main() {
	out := flag.String("out", "", "output directory (required)")
	size := flag.String("size", "20MiB", "approximate total tensor size (e.g. 24MiB, 2GiB, 1e9)")
	shards := flag.Int("shards", 4, "number of .safetensors shards")
	seed := flag.Uint64("seed", 1, "random seed")
	ft := flag.String("finetune", "", "fine-tune this checkpoint into -out instead of generating one")
	fraction := flag.Float64("fraction", 0.30, "with -finetune: share of tensor bytes to rewrite")
	noNew := flag.Bool("no-new-tensor", false, "with -finetune: do not insert a new tensor")
	quiet := flag.Bool("q", false, "no progress line on stderr")
	perturb := flag.String("perturb", "", "move -fraction of the bf16 elements of every tensor of this checkpoint by -relative, into -out (an RL step: 0.02; a full fine-tune: 1)")
	relative := flag.Float64("relative", 0.05, "with -perturb: relative size of a move")
	replace := flag.String("replace", "", "with -perturb: comma-separated tensors whose values are replaced by unrelated ones")
	flag.Parse()
	if *out == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	start := time.Now()
	if *perturb != "" {
		opts := synth.PerturbOptions{Fraction: *fraction, Relative: *relative, Seed: *seed}
		if *replace != "" {
			opts.Replace = strings.Split(*replace, ",")
		}
		rep, err := synth.Perturb(*perturb, *out, opts)
		if err != nil {
			fatal(err)
		}
		if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
			fatal(err)
		}
		return
	}
	if *ft != "" {
		ftSeed := *seed
		if !isFlagSet("seed") {
			ftSeed = 2
		}
		rep, err := synth.FineTune(*ft, *out, synth.FineTuneOptions{Fraction: *fraction, Seed: ftSeed, NoNewTensor: *noNew})
		if err != nil {
			fatal(err)
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fatal(err)
		}
		if !*quiet {
			fmt.Fprintf(os.Stderr, "synth: fine-tuned %s -> %s: %d of %d tensor bytes new (%.1f%%) in %s\n",
				*ft, *out, rep.ChangedTensorBytes+rep.NewTensorBytes, rep.TensorBytes, 100*rep.Fraction(), time.Since(start).Round(time.Millisecond))
		}
		return
	}
	n, err := ParseSize(*size)
	if err != nil {
		fatal(err)
	}
	opts := synth.Options{TargetBytes: n, Shards: *shards, Seed: *seed}
	if err := synth.Generate(*out, opts); err != nil {
		fatal(err)
	}
	if !*quiet {
		m := synth.ChooseModel(opts)
		el := time.Since(start)
		fmt.Fprintf(os.Stderr, "synth: wrote %s (layers=%d hidden=%d intermediate=%d vocab=%d, %d shards) in %s, %.0f MB/s\n",
			*out, m.Layers, m.Hidden, m.Intermediate, m.Vocab, *shards, el.Round(time.Millisecond), float64(n)/el.Seconds()/1e6)
	}
}

func isFlagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// ParseSize parses sizes like 512, 20MiB, 2GiB, 1.5GB, 1e9.
func ParseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1},
	}
	t := strings.TrimSpace(s)
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suffix)) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return int64(v * mult), nil
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "synth:", err)
	os.Exit(1)
}
