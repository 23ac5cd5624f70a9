package synth

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
)

// GGUFOptions shape a generated GGUF checkpoint (llama.cpp's format).
type GGUFOptions struct {
	Blocks int    // transformer blocks
	Hidden int    // hidden size (a multiple of 32)
	Seed   uint64 // seeds the values
	// Tuned names the tensors whose values a fine-tune changed: they get
	// values from another stream. Nil: the base checkpoint.
	Tuned func(name string) bool
}

// GGUFTensor is a tensor of a generated GGUF file.
type GGUFTensor struct {
	Name  string
	Type  uint32 // ggml type: 0 F32, 1 F16, 8 Q8_0
	Dims  []uint64
	Bytes int64
}

// GGUFTensors lists the tensors of a checkpoint of these options, in file
// order: per block attention and FFN matrices as F16 and Q8_0, and F32
// norms.
func (o GGUFOptions) GGUFTensors() []GGUFTensor {
	h := uint64(o.Hidden)
	var ts []GGUFTensor
	add := func(name string, typ uint32, dims ...uint64) {
		n := int64(1)
		for _, d := range dims {
			n *= int64(d)
		}
		switch typ {
		case 0:
			n *= 4
		case 1:
			n *= 2
		case 8:
			n = n / 32 * 34
		}
		ts = append(ts, GGUFTensor{Name: name, Type: typ, Dims: dims, Bytes: n})
	}
	for b := range o.Blocks {
		add(fmt.Sprintf("blk.%d.attn_norm.weight", b), 0, h)
		add(fmt.Sprintf("blk.%d.attn_q.weight", b), 1, h, h)
		add(fmt.Sprintf("blk.%d.attn_k.weight", b), 1, h, h)
		add(fmt.Sprintf("blk.%d.ffn_norm.weight", b), 0, h)
		add(fmt.Sprintf("blk.%d.ffn_up.weight", b), 8, h, 2*h)
	}
	add("output_norm.weight", 0, h)
	return ts
}

// WriteGGUF writes a version 3 GGUF checkpoint (general.architecture
// "llama", alignment 32) to path.
func WriteGGUF(path string, o GGUFOptions) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	w := bufio.NewWriterSize(f, writeBuf)
	put := func(v any) { _ = binary.Write(w, binary.LittleEndian, v) }
	str := func(s string) { put(uint64(len(s))); w.WriteString(s) }
	ts := o.GGUFTensors()
	w.WriteString("GGUF")
	put(uint32(3))
	put(uint64(len(ts)))
	put(uint64(2))
	str("general.architecture")
	put(uint32(8))
	str("llama")
	str("general.alignment")
	put(uint32(4))
	put(uint32(32))
	var off int64
	for _, t := range ts {
		str(t.Name)
		put(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			put(d)
		}
		put(t.Type)
		put(uint64(off))
		off = ggufPad(off + t.Bytes)
	}
	pos := o.headerBytes()
	w.Write(make([]byte, ggufPad(pos)-pos))
	for _, t := range ts {
		tag := "base"
		if o.Tuned != nil && o.Tuned(t.Name) {
			tag = "tuned"
		}
		r := newRNG(o.Seed, tag, t.Name)
		var b [8]byte
		for n := int64(0); n < t.Bytes; n += 8 {
			binary.LittleEndian.PutUint64(b[:], r.next())
			w.Write(b[:min(8, t.Bytes-n)])
		}
		w.Write(make([]byte, ggufPad(t.Bytes)-t.Bytes))
	}
	return w.Flush()
}

// ggufPad rounds n up to the alignment, 32.
func ggufPad(n int64) int64 { return (n + 31) / 32 * 32 }

// headerBytes is the length of the header WriteGGUF writes, before its
// padding: magic, version, counts, two key-values, the tensor records.
func (o GGUFOptions) headerBytes() int64 {
	pos := int64(4+4+8+8) + 8 + 20 + 4 + 8 + 5 + 8 + 17 + 4 + 4
	for _, t := range o.GGUFTensors() {
		pos += 8 + int64(len(t.Name)) + 4 + 8*int64(len(t.Dims)) + 4 + 8
	}
	return pos
}

// GGUFLayout returns where WriteGGUF puts the tensor data (the end of the
// header and its padding) and each tensor's offset in the file.
func (o GGUFOptions) GGUFLayout() (dataStart int64, offsets []int64) {
	dataStart = ggufPad(o.headerBytes())
	off := dataStart
	for _, t := range o.GGUFTensors() {
		offsets = append(offsets, off)
		off += ggufPad(t.Bytes)
	}
	return dataStart, offsets
}
