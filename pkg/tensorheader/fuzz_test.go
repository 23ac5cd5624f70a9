package tensorheader

import (
	"testing"
)

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
