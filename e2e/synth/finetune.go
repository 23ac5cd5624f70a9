package synth

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// FineTuneOptions controls FineTune.
type FineTuneOptions struct {
	// Fraction of the tensor bytes to rewrite with new values (default
	// 0.30). Whole tensors are rewritten, so the result is close to, and
	// never above, Fraction of the bytes (unless Fraction is 1).
	Fraction float64
	// Seed picks the tensors and their new values.
	Seed uint64
	// NoNewTensor skips inserting the new bias tensor.
	NoNewTensor bool
}

// Report describes what FineTune changed.
type Report struct {
	// TotalBytes is the size of all files in dst.
	TotalBytes int64
	// TensorBytes is the tensor data in dst, new tensor included.
	TensorBytes int64
	// ChangedTensors lists the rewritten tensors (same shape, new values).
	ChangedTensors     []string
	ChangedTensorBytes int64
	// NewTensor is the inserted tensor's name, in NewTensorShard; every
	// tensor after it in that shard moved by NewTensorBytes.
	NewTensor      string
	NewTensorShard string
	NewTensorBytes int64
	// HeaderBytes is the size of all shard headers in dst (8-byte length
	// plus JSON); ChangedHeaderBytes only of those that differ from src.
	HeaderBytes        int64
	ChangedHeaderBytes int64
	// ChangedFiles are the files other than tensor data that changed
	// (the index), and ChangedFileBytes their size in dst.
	ChangedFiles     []string
	ChangedFileBytes int64
}

// Fraction is the share of dst tensor bytes that are new or rewritten.
func (r Report) Fraction() float64 {
	if r.TensorBytes == 0 {
		return 0
	}
	return float64(r.ChangedTensorBytes+r.NewTensorBytes) / float64(r.TensorBytes)
}

// FineTune copies the checkpoint in src to dst, rewrites about
// opts.Fraction of the tensor bytes with new random values of the same
// shape, and inserts a small new tensor (a [hidden] bias) into one shard, so
// that the later tensors of that shard shift and its header changes.
func FineTune(src, dst string, opts FineTuneOptions) (Report, error) {
	var rep Report
	if opts.Fraction == 0 {
		opts.Fraction = 0.30
	}
	if opts.Fraction < 0 || opts.Fraction > 1 {
		return rep, fmt.Errorf("synth: fraction %v out of range [0,1]", opts.Fraction)
	}
	shards, others, err := readCheckpoint(src)
	if err != nil {
		return rep, err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return rep, err
	}
	changed, tensorBytes := pickChanged(shards, opts, &rep)
	newShard, newSpec := -1, tensorSpec{}
	if !opts.NoNewTensor {
		if newShard, newSpec = placeNewTensor(shards); newShard < 0 {
			return rep, fmt.Errorf("synth: no shard with a layer to add a tensor to")
		}
		rep.NewTensor, rep.NewTensorShard, rep.NewTensorBytes = newSpec.name, shards[newShard].File, newSpec.size()
	}
	if err := writeShards(src, dst, shards, changed, newShard, newSpec, opts.Seed); err != nil {
		return rep, err
	}
	// Copy or rewrite the other files.
	for _, name := range others {
		sp, dp := filepath.Join(src, name), filepath.Join(dst, name)
		if name == IndexName && newShard >= 0 {
			if err := addToIndex(sp, dp, newSpec, shards[newShard].File, tensorBytes); err != nil {
				return rep, err
			}
			continue
		}
		if err := copyFile(sp, dp); err != nil {
			return rep, err
		}
	}
	if err := measureShards(src, dst, shards, &rep); err != nil {
		return rep, err
	}
	return rep, measureOthers(src, dst, &rep)
}

// readCheckpoint lists the checkpoint in src: its shards, read and sorted
// by file name, and its other regular files.
func readCheckpoint(src string) ([]*Shard, []string, error) {
	entries, err := os.ReadDir(src)
	if err != nil {
		return nil, nil, err
	}
	var shards []*Shard
	var others []string
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		if strings.HasSuffix(e.Name(), ".safetensors") {
			s, err := ReadShard(filepath.Join(src, e.Name()))
			if err != nil {
				return nil, nil, err
			}
			shards = append(shards, s)
		} else {
			others = append(others, e.Name())
		}
	}
	if len(shards) == 0 {
		return nil, nil, fmt.Errorf("synth: no .safetensors files in %s", src)
	}
	sort.Slice(shards, func(a, b int) bool { return shards[a].File < shards[b].File })
	return shards, others, nil
}

// pickChanged picks the tensors to rewrite: a seeded shuffle, taken
// greedily while they fit under opts.Fraction of the tensor bytes. It
// records them in rep and returns them by name, with the tensor bytes of
// src.
func pickChanged(shards []*Shard, opts FineTuneOptions, rep *Report) (map[string]bool, int64) {
	type ref struct {
		shard int
		t     Tensor
	}
	var all []ref
	var tensorBytes int64
	for k, s := range shards {
		for _, t := range s.Tensors {
			all = append(all, ref{k, t})
			tensorBytes += t.Size()
		}
	}
	r := newRNG(opts.Seed, "select")
	for k := len(all) - 1; k > 0; k-- {
		j := r.intn(k + 1)
		all[k], all[j] = all[j], all[k]
	}
	target := int64(opts.Fraction * float64(tensorBytes))
	changed := map[string]bool{}
	for _, c := range all {
		if rep.ChangedTensorBytes+c.t.Size() <= target {
			changed[c.t.Name] = true
			rep.ChangedTensors = append(rep.ChangedTensors, c.t.Name)
			rep.ChangedTensorBytes += c.t.Size()
		}
	}
	sort.Strings(rep.ChangedTensors)
	return changed, tensorBytes
}

// placeNewTensor returns where to insert the new tensor: the lowest layer
// of the first shard holding a layer, as a self_attn.o_proj.bias (sorted
// into the middle of that layer's tensors); -1 when no shard has one.
func placeNewTensor(shards []*Shard) (int, tensorSpec) {
	for k, s := range shards {
		best := -1
		var hidden int64
		for _, t := range s.Tensors {
			l, ok := layerOf(t.Name)
			if ok && (best < 0 || l < best) {
				best = l
			}
		}
		if best < 0 {
			continue
		}
		for _, t := range s.Tensors {
			if l, _ := layerOf(t.Name); l == best && len(t.Shape) == 2 && strings.Contains(t.Name, "self_attn.") {
				hidden = t.Shape[0]
			}
		}
		if hidden == 0 {
			continue
		}
		return k, tensorSpec{name: fmt.Sprintf("model.layers.%d.self_attn.o_proj.bias", best), shape: []int64{hidden}}
	}
	return -1, tensorSpec{}
}

// writeShards writes the shards into dst, in parallel: copied when
// untouched, else with the changed tensors regenerated and, in shard
// newShard (-1 for none), the new tensor added.
func writeShards(src, dst string, shards []*Shard, changed map[string]bool, newShard int, newSpec tensorSpec, seed uint64) error {
	var jobs []func() error
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for k, s := range shards {
		srcPath, dstPath := filepath.Join(src, s.File), filepath.Join(dst, s.File)
		touched := k == newShard
		for _, t := range s.Tensors {
			touched = touched || changed[t.Name]
		}
		if !touched {
			jobs = append(jobs, func() error { return copyFile(srcPath, dstPath) })
			continue
		}
		f, err := os.Open(srcPath)
		if err != nil {
			return err
		}
		files = append(files, f)
		var plan []plannedTensor
		for _, t := range s.Tensors {
			spec := tensorSpec{name: t.Name, shape: t.Shape, norm: isNorm(t.Name)}
			if changed[t.Name] {
				plan = append(plan, plannedTensor{spec: spec, src: genSource{seed: seed, tag: "finetune", norm: spec.norm}})
			} else {
				plan = append(plan, plannedTensor{spec: spec, copyFrom: f, copyOff: s.DataStart() + t.Begin})
			}
		}
		if k == newShard {
			plan = append(plan, plannedTensor{spec: newSpec, src: genSource{seed: seed, tag: "finetune-new"}})
		}
		jobs = append(jobs, func() error { return writeShard(dstPath, plan) })
	}
	return runParallel(jobs)
}

// addToIndex writes the index sp to dp with the new tensor in shard file
// added, and the total size grown by it.
func addToIndex(sp, dp string, newSpec tensorSpec, file string, tensorBytes int64) error {
	b, err := os.ReadFile(sp)
	if err != nil {
		return err
	}
	var idx indexFile
	if err := json.Unmarshal(b, &idx); err != nil {
		return fmt.Errorf("%s: %w", sp, err)
	}
	if idx.Metadata == nil {
		idx.Metadata = map[string]any{}
	}
	idx.WeightMap[newSpec.name] = file
	idx.Metadata["total_size"] = tensorBytes + newSpec.size()
	return writeJSON(dp, idx)
}

// measureShards adds the header and tensor bytes of dst's shards to rep.
func measureShards(src, dst string, shards []*Shard, rep *Report) error {
	for _, s := range shards {
		d, err := ReadShard(filepath.Join(dst, s.File))
		if err != nil {
			return err
		}
		rep.HeaderBytes += d.DataStart()
		for _, t := range d.Tensors {
			rep.TensorBytes += t.Size()
		}
		same, err := sameRange(filepath.Join(src, s.File), filepath.Join(dst, s.File), s.DataStart(), d.DataStart())
		if err != nil {
			return err
		}
		if !same {
			rep.ChangedHeaderBytes += d.DataStart()
		}
	}
	return nil
}

// measureOthers adds the size of dst's regular files to rep, and the files
// other than shards that differ from src's.
func measureOthers(src, dst string, rep *Report) error {
	dstEntries, err := os.ReadDir(dst)
	if err != nil {
		return err
	}
	for _, e := range dstEntries {
		fi, err := e.Info()
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		rep.TotalBytes += fi.Size()
		if strings.HasSuffix(e.Name(), ".safetensors") {
			continue
		}
		sp := filepath.Join(src, e.Name())
		sfi, err := os.Stat(sp)
		same := err == nil && sfi.Size() == fi.Size()
		if same {
			same, err = sameRange(sp, filepath.Join(dst, e.Name()), fi.Size(), fi.Size())
			if err != nil {
				return err
			}
		}
		if !same {
			rep.ChangedFiles = append(rep.ChangedFiles, e.Name())
			rep.ChangedFileBytes += fi.Size()
		}
	}
	return nil
}

// layerOf returns N for "model.layers.N.…".
func layerOf(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "model.layers.")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(num)
	return n, err == nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// sameRange reports whether the first na bytes of a equal the first nb
// bytes of b.
func sameRange(a, b string, na, nb int64) (bool, error) {
	if na != nb {
		return false, nil
	}
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); off < na; {
		n := min(int64(len(ba)), na-off)
		if _, err := fa.ReadAt(ba[:n], off); err != nil {
			return false, err
		}
		if _, err := fb.ReadAt(bb[:n], off); err != nil {
			return false, err
		}
		if !bytes.Equal(ba[:n], bb[:n]) {
			return false, nil
		}
		off += n
	}
	return true, nil
}
