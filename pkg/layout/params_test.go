package layout

import (
	"errors"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

func TestParamsCompleted(t *testing.T) {
	for _, c := range []struct{ in, want Params }{
		{Params{}, Params{}},
		{Params{Avg: 64 << 10}, Params{Min: 16 << 10, Avg: 64 << 10, Max: 16 << 20}},
		{Params{Min: 512 << 10, Avg: 1 << 20, Max: 4 << 20}, Params{Min: 512 << 10, Avg: 1 << 20, Max: 4 << 20}},
		{Params{Min: 32 << 20}, Params{Min: 32 << 20, Avg: 32 << 20, Max: 64 << 20}},
	} {
		got, err := c.in.Completed()
		if err != nil || got != c.want {
			t.Errorf("%+v completed: %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	// Min above max; and max alone leaves min at 0 (avg is derived after
	// min), as the CLI always did.
	for _, bad := range []Params{{Min: 8 << 20, Max: 1 << 20}, {Max: 4 << 20}} {
		if _, err := bad.Completed(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// v1Params are DefaultParams as format version 1 records them (no pack size).
var v1Params = Params{Min: DefaultParams.Min, Avg: DefaultParams.Avg, Max: DefaultParams.Max}

// expand turns an opened index into its expanded form, for tests that
// change its entries.
func expand(x *Index) {
	x.Files = x.AllFiles()
}

// TestValidateReservedNames: no element of an entry's path may be named
// like bdnvol's own files.
func TestValidateReservedNames(t *testing.T) {
	for _, p := range []string{".bdnvol-pull", "d/.bdnvol-pull", "d/.bdnvol-0123456789abcdef.part", ".bdnvol-index.lock"} {
		x := validIndex()
		if strings.HasPrefix(p, "d/") {
			x.Files[1].Path = p
			x.Files[1], x.Files[2] = x.Files[2], x.Files[1] // keep sorted: d/.b < d/l
			x.Files[1], x.Files[2] = x.Files[2], x.Files[1]
			x.Files = []File{x.Files[0], x.Files[1]}
		} else {
			x.Files = append([]File{{Path: p, Type: TypeFile, Mode: 0o644, Size: 10, Digest: digest.FromString("f"), Extents: []Extent{{0, 0, 10}}}}, x.Files...)
		}
		if err := x.Validate(); !errors.Is(err, ErrInvalidIndex) || !strings.Contains(err.Error(), "bdnvol's own") {
			t.Errorf("%s: got %v, want a refusal of the reserved name", p, err)
		}
	}
	x := validIndex()
	x.Files[1].Path = "d/x.bdnvol-"
	x.Files[1], x.Files[2] = x.Files[2], x.Files[1]
	if err := x.Validate(); err != nil {
		t.Errorf("a name with the prefix inside it is refused: %v", err)
	}
}

// TestDecodeIndexCanonical: an index is accepted only in its one encoding.
func TestDecodeIndexCanonical(t *testing.T) {
	x := validIndex()
	x.Files[1].Path = "d/<a&b>\u2028é"
	good, err := x.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeIndex(good); err != nil {
		t.Fatalf("the canonical encoding is refused: %v", err)
	}
	s := string(good)
	for name, bad := range map[string]string{
		"duplicate key":   strings.Replace(s, `"files":[`, `"files":[],"files":[`, 1),
		"key case":        strings.Replace(s, `"files"`, `"Files"`, 1),
		"whitespace":      strings.Replace(s, `"version":1`, `"version": 1`, 1),
		"trailing space":  s + " ",
		"newline":         s + "\n",
		"escaped letter":  strings.Replace(s, `"path":"d"`, `"path":"\u0064"`, 1),
		"escaped html":    strings.Replace(s, `<a&b>`, `\u003ca\u0026b\u003e`, 1),
		"exponent":        strings.Replace(s, `"mode":493`, `"mode":4.93e2`, 1),
		"explicit zero":   strings.Replace(s, `"mode":493}`, `"mode":493,"size":0}`, 1),
		"fields reversed": strings.Replace(s, `{"path":"d","type":"dir","mode":493}`, `{"mode":493,"type":"dir","path":"d"}`, 1),
	} {
		if bad == s {
			t.Fatalf("%s: the mutation did nothing", name)
		}
		if _, err := DecodeIndex([]byte(bad)); !errors.Is(err, ErrInvalidIndex) {
			t.Errorf("%s: got %v, want ErrInvalidIndex", name, err)
		}
	}
	// Not UTF-8: encoding/json would write U+FFFD, another name.
	x = validIndex()
	x.Files[1].Path = "d/\xff"
	if err := x.Validate(); err == nil {
		t.Error("a path that is not UTF-8 is accepted")
	}
	x = validIndex()
	x.Files[2].Target = "\xff"
	if err := x.Validate(); err == nil || !strings.Contains(err.Error(), "target") {
		t.Errorf("a symlink target that is not UTF-8 is accepted: %v", err)
	}
}

// TestParamsInherited: parameters below the floor are raised, ordered;
// sane ones are kept as they are (so later pushes dedup).
func TestParamsInherited(t *testing.T) {
	for in, want := range map[Params]Params{
		{64, 64, 64, 0}:                    {4 << 10, 8 << 10, 16 << 10, 0},
		{64, 1 << 20, 2 << 20, 64}:         {4 << 10, 1 << 20, 2 << 20, 4 << 10},
		{16 << 10, 64 << 10, 256 << 10, 0}: {16 << 10, 64 << 10, 256 << 10, 0},
		DefaultParams:                      DefaultParams,
		{32 << 10, 32 << 10, 32 << 10, 0}:  {32 << 10, 32 << 10, 32 << 10, 0},
	} {
		got := in.Inherited()
		if got != want || got.Validate() != nil {
			t.Errorf("%+v: got %+v, want %+v", in, got, want)
		}
	}
	// A version 1 volume's parameters gain small packs; a version 2
	// volume's are kept.
	if got := (&Index{Version: FormatVersion1, Chunking: v1Params}).InheritedParams(); got != DefaultParams {
		t.Errorf("version 1 defaults inherited as %+v", got)
	}
	if got := (&Index{Version: FormatVersion, Chunking: v1Params}).InheritedParams(); got != v1Params {
		t.Errorf("version 2 without a pack size inherited as %+v", got)
	}
}
