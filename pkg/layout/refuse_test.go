package layout

import (
	"errors"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

// TestRefusalsAreShort checks that refusing a long symlink target, path or
// string field echoes a bounded, quoted prefix of it, not all of it.
func TestRefusalsAreShort(t *testing.T) {
	d := digest.FromString("x")
	file := func(p string) File {
		return File{Path: p, Type: TypeFile, Mode: 0o644, Digest: digest.FromString(""), Size: 0}
	}
	long := strings.Repeat("../", 1700) + "x" // 5101 bytes
	deep := strings.Repeat("a/", 1500) + "b"  // 3001 bytes
	cases := map[string]*Index{
		"bad target":         {Files: []File{{Path: "l", Type: TypeSymlink, Mode: 0o777, Target: long + "\x1b]0;pwned\x07"}}},
		"leaves the volume":  {Files: []File{{Path: "l", Type: TypeSymlink, Mode: 0o777, Target: long[:4000]}}},
		"absolute target":    {Files: []File{{Path: "l", Type: TypeSymlink, Mode: 0o777, Target: "/" + long[:4000]}}},
		"unsafe path":        {Files: []File{file("/" + deep)}},
		"parent":             {Files: []File{file(deep)}},
		"unknown type":       {Files: []File{{Path: "f", Type: strings.Repeat("t", 100000)}}},
		"bad digest":         {Chunks: []Chunk{{Digest: digest.Digest("sha256:" + strings.Repeat("0", 100000)), Size: 1}}},
		"bad edge digest":    {Chunks: []Chunk{{Digest: d, Size: EdgeMinChunk, Head: digest.Digest(strings.Repeat("h", 9000)), Tail: d}}},
		"file bad digest":    {Files: []File{{Path: "f", Type: TypeFile, Digest: digest.Digest(strings.Repeat("z", 9000))}}},
		"after a name (..)":  {Files: []File{{Path: "l", Type: TypeSymlink, Mode: 0o777, Target: "a/" + long[:4000]}}},
		"a path with escape": {Files: []File{file("\x1b[2J" + deep[:3000] + "/../x")}},
	}
	for name, x := range cases {
		x.Version = FormatVersion
		err := x.Validate()
		if !errors.Is(err, ErrInvalidIndex) {
			t.Errorf("%s: %v, want ErrInvalidIndex", name, err)
			continue
		}
		msg := err.Error()
		if len(msg) > 400 || !strings.Contains(msg, " bytes)") {
			t.Errorf("%s: refusal of %d bytes, want a short one naming the length: %.300s", name, len(msg), msg)
		}
		if strings.ContainsAny(msg, "\x1b\x07") {
			t.Errorf("%s: refusal holds a raw control character: %q", name, msg)
		}
	}
}
