package tensorheader

import (
	"testing"
)

func TestSafetensorsHeader(t *testing.T) {
	hdr := []byte(`{"__metadata__":{"x":"y"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}`)
	size := int64(8 + len(hdr) + 8)
	end, ts, err := ParseSafetensorsHeader(hdr, size)
	if err != nil {
		t.Fatal(err)
	}
	if end != int64(8+len(hdr)) || len(ts) != 2 || ts[0].Name != "a" || ts[1].Begin != end+4 {
		t.Fatalf("got end %d tensors %+v", end, ts)
	}
	for _, bad := range []string{
		`{"a":{"data_offsets":[0,100]}}`,                          // past the end
		`{"a":{"data_offsets":[4,2]}}`,                            // reversed
		`{"a":{"data_offsets":[0,6]},"b":{"data_offsets":[4,8]}}`, // overlap
		`not json`,
	} {
		if _, _, err := ParseSafetensorsHeader([]byte(bad), int64(8+len(bad)+8)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}
