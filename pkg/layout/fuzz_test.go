package layout

import (
	"bytes"
	"errors"
	"strconv"
	"testing"

	"github.com/opencontainers/go-digest"
)

func FuzzDecodeIndex(f *testing.F) {
	b, _ := validIndex().Encode()
	f.Add(b)
	f.Add([]byte(`{"version":1,"chunking":{"min":1,"avg":1,"max":1},"chunks":[],"files":[{"path":"../x","type":"dir","mode":493}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		x, err := DecodeIndex(data)
		if err != nil {
			return
		}
		if err := x.Validate(); err != nil {
			t.Fatalf("decoded index fails validation: %v", err)
		}
		if b, err := x.Encode(); err != nil || !bytes.Equal(b, data) {
			t.Fatalf("decoded index is not in its canonical encoding (%v)", err)
		}
	})
}

// FuzzDecodeIndexV2 decodes a top-level index and two pieces (the top's
// placeholders @P0@/@S0@ and @P1@/@S1@ are the pieces' digests and
// sizes): it must refuse or return a valid index, never panic.
func FuzzDecodeIndexV2(f *testing.F) {
	top, pieces, err := encodeV2(v2Index(), PieceParams{Min: 4, Avg: 4, Max: 6, MaxBytes: 1 << 20})
	if err != nil || len(pieces) != 2 {
		f.Fatalf("%d pieces (%v)", len(pieces), err)
	}
	for i, p := range pieces {
		top = bytes.Replace(top, []byte(digest.FromBytes(p)), []byte("@P"+strconv.Itoa(i)+"@"), 1)
		top = bytes.Replace(top, []byte(`"size":`+strconv.Itoa(len(p))+`,`), []byte(`"size":@S`+strconv.Itoa(i)+`@,`), 1)
	}
	f.Add(top, pieces[0], pieces[1])
	f.Add([]byte(`{"version":2,"chunking":{"min":1,"avg":1,"max":1},"piecing":{"min":1,"avg":1,"max":1,"maxBytes":1},"entries":1,"bytes":0,"chunks":0,"pieces":[{"digest":"@P0@","size":@S0@,"first":"..","entries":1,"bytes":0}]}`), []byte(`{"chunks":[],"files":[{"path":"..","type":"dir","mode":493}]}`), []byte{})
	f.Fuzz(func(t *testing.T, top, p0, p1 []byte) {
		for i, p := range [][]byte{p0, p1} {
			n := strconv.Itoa(i)
			top = bytes.ReplaceAll(top, []byte("@P"+n+"@"), []byte(digest.FromBytes(p)))
			top = bytes.ReplaceAll(top, []byte("@S"+n+"@"), []byte(strconv.Itoa(len(p))))
		}
		ps := [][]byte{p0, p1}
		if !bytes.Contains(top, []byte(digest.FromBytes(p1))) {
			ps = ps[:1]
		}
		x, err := DecodeIndexV2(top, ps)
		if err != nil {
			if !errors.Is(err, ErrInvalidIndex) {
				t.Fatalf("error without ErrInvalidIndex: %v", err)
			}
			return
		}
		if err := x.Validate(); err != nil {
			t.Fatalf("decoded index fails validation: %v", err)
		}
	})
}
