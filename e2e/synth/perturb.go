package synth

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// PerturbOptions controls Perturb.
type PerturbOptions struct {
	// Fraction of the bf16 elements of every tensor that move (an RL
	// step: 0.02; a full fine-tune: 1).
	Fraction float64
	// Relative is the size of a move relative to the weight (default
	// 0.05): new = old × (1 + Relative × N(0,1)), rounded to bf16.
	Relative float64
	// Replace names tensors whose values are replaced by unrelated ones.
	Replace []string
	// Seed picks the elements and the moves.
	Seed uint64
}

// PerturbReport says what Perturb changed.
type PerturbReport struct {
	TensorBytes  int64 // tensor data in dst
	ChangedBytes int64 // bytes of elements whose bf16 value changed
}

// Perturb copies the checkpoint in src to dst (same files, same headers)
// and moves a fraction of the bf16 elements of every tensor by a small
// relative amount: the training step that touches every tensor a little.
// Files other than .safetensors are copied as they are.
func Perturb(src, dst string, opts PerturbOptions) (PerturbReport, error) {
	if opts.Relative == 0 {
		opts.Relative = 0.05
	}
	var rep PerturbReport
	entries, err := os.ReadDir(src)
	if err != nil {
		return rep, err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return rep, err
	}
	replace := map[string]bool{}
	for _, n := range opts.Replace {
		replace[n] = true
	}
	for _, e := range entries {
		sp, dp := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if !strings.HasSuffix(e.Name(), ".safetensors") {
			if err := copyFile(sp, dp); err != nil {
				return rep, err
			}
			continue
		}
		s, err := ReadShard(sp)
		if err != nil {
			return rep, err
		}
		b, err := os.ReadFile(sp)
		if err != nil {
			return rep, err
		}
		for _, t := range s.Tensors {
			data := b[s.DataStart()+t.Begin : s.DataStart()+t.End]
			rep.TensorBytes += int64(len(data))
			r := newRNG(opts.Seed, "perturb", e.Name(), t.Name)
			for i := 0; i+1 < len(data); i += 2 {
				old := binary.LittleEndian.Uint16(data[i:])
				var v uint16
				switch {
				case replace[t.Name]:
					v = uint16(r.next())
				case r.float64() < opts.Fraction:
					w := math.Float32frombits(uint32(old) << 16)
					w *= float32(1 + opts.Relative*gauss(r))
					v = uint16(math.Float32bits(w) >> 16)
				default:
					continue
				}
				if v != old {
					rep.ChangedBytes += 2
				}
				binary.LittleEndian.PutUint16(data[i:], v)
			}
		}
		if err := os.WriteFile(dp, b, 0o644); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// gauss returns a draw of N(0, 1) (Box-Muller).
func gauss(r *rng) float64 {
	u := max(r.float64(), 1e-12)
	return math.Sqrt(-2*math.Log(u)) * math.Cos(2*math.Pi*r.float64())
}
