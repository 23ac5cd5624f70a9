package layout

import (
	"bytes"
	"testing"
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

func FuzzSafetensorsHeader(f *testing.F) {
	f.Add([]byte(`{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}`), int64(100))
	f.Fuzz(func(t *testing.T, hdr []byte, size int64) {
		end, ts, err := ParseSafetensorsHeader(hdr, size)
		if err != nil {
			return
		}
		for i, x := range ts {
			if x.Begin < end || x.End > size || x.End < x.Begin || (i > 0 && x.Begin < ts[i-1].End) {
				t.Fatalf("bad tensor %+v", x)
			}
		}
	})
}
