package synth

import (
	"io"
	"os"
	"sort"
)

// genSource generates a tensor's bytes from a seed and the tensor's name.
type genSource struct {
	seed uint64
	tag  string // distinguishes fine-tuned values from the originals
	norm bool
}

// plannedTensor is a tensor to write: either generated or copied from an
// existing file.
type plannedTensor struct {
	spec     tensorSpec
	src      genSource
	copyFrom *os.File // when set, copy spec.size() bytes from copyOff
	copyOff  int64
}

const writeBuf = 4 << 20

// writeShard writes a .safetensors file with the tensors sorted by name, as
// the safetensors library does.
func writeShard(path string, tensors []plannedTensor) (err error) {
	sort.Slice(tensors, func(a, b int) bool { return tensors[a].spec.name < tensors[b].spec.name })
	ts := make([]Tensor, len(tensors))
	for k, t := range tensors {
		ts[k] = Tensor{Name: t.spec.name, Shape: t.spec.shape}
	}
	hdr := header(map[string]string{"format": "pt"}, ts)

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	buf := make([]byte, writeBuf)
	var lb [8]byte
	n := uint64(len(hdr))
	for k := range lb {
		lb[k] = byte(n >> (8 * k))
	}
	if _, err := f.Write(lb[:]); err != nil {
		return err
	}
	if _, err := f.Write(hdr); err != nil {
		return err
	}
	for _, t := range tensors {
		size := t.spec.size()
		if t.copyFrom != nil {
			if _, err := io.CopyBuffer(f, io.NewSectionReader(t.copyFrom, t.copyOff, size), buf); err != nil {
				return err
			}
			continue
		}
		table := weightTable
		if t.src.norm {
			table = normTable
		}
		r := newRNG(t.src.seed, t.src.tag, t.spec.name)
		for size > 0 {
			p := buf[:min(int64(len(buf)), size)]
			r.fill(p, table)
			if _, err := f.Write(p); err != nil {
				return err
			}
			size -= int64(len(p))
		}
	}
	return nil
}
