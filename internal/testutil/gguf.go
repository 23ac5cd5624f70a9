package testutil

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// GGUFTensor is one tensor GGUF writes: its name, ggml type (0 F32, 1
// F16, 30 BF16...), dimensions and data (len(Data) bytes).
type GGUFTensor struct {
	Name string
	Type uint32
	Dims []uint64
	Data []byte
}

// GGUF returns a version 3 GGUF file: the given string metadata (in the
// order given, key then value), general.alignment = align, then the
// tensors' data in order, each padded to align.
func GGUF(meta []string, align uint32, tensors []GGUFTensor) []byte {
	var b bytes.Buffer
	w := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { w(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	w(uint32(3))
	w(uint64(len(tensors)))
	w(uint64(len(meta)/2 + 1))
	for i := 0; i+1 < len(meta); i += 2 {
		str(meta[i])
		w(uint32(8))
		str(meta[i+1])
	}
	str("general.alignment")
	w(uint32(4))
	w(align)
	pad := func(n uint64) uint64 { return (n + uint64(align) - 1) / uint64(align) * uint64(align) }
	var off uint64
	for _, t := range tensors {
		str(t.Name)
		w(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			w(d)
		}
		w(t.Type)
		w(off)
		off = pad(off + uint64(len(t.Data)))
	}
	b.Write(make([]byte, pad(uint64(b.Len()))-uint64(b.Len())))
	for _, t := range tensors {
		b.Write(t.Data)
		b.Write(make([]byte, pad(uint64(len(t.Data)))-uint64(len(t.Data))))
	}
	return b.Bytes()
}

// GGUFCheckpoint is a generated GGUF model: n F16 matrices of big bytes
// each, a small F32 norm after each, the data of tensor i from seed+i.
func GGUFCheckpoint(n, big int, seed func(i int) uint64) []byte {
	var ts []GGUFTensor
	for i := range n {
		ts = append(ts,
			GGUFTensor{Name: fmt.Sprintf("blk.%d.attn_q.weight", i), Type: 1, Dims: []uint64{uint64(big / 2 / 64), 64}, Data: RandBytes(seed(i), big)},
			GGUFTensor{Name: fmt.Sprintf("blk.%d.attn_norm.weight", i), Type: 0, Dims: []uint64{250}, Data: RandBytes(seed(i)+1<<32, 1000)})
	}
	return GGUF([]string{"general.architecture", "llama", "general.name", "test"}, 32, ts)
}
