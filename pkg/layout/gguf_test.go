package layout

import (
	"bytes"
	"context"
	"slices"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

// TestGGUFCutStreamMatchesCutFile: a GGUF file cut as a stream (import)
// gives the chunks CutFile (push) gives, at tensor boundaries.
func TestGGUFCutStreamMatchesCutFile(t *testing.T) {
	b := testutil.GGUFCheckpoint(4, 300<<10, func(i int) uint64 { return uint64(7 + i) })
	p := Params{Min: 64 << 10, Avg: 128 << 10, Max: 256 << 10}
	type cut struct {
		off int64
		d   string
	}
	var file, stream []cut
	ctx := context.Background()
	if err := CutFile(ctx, bytes.NewReader(b), "m.gguf", int64(len(b)), p, func(off int64, d digest.Digest) { file = append(file, cut{off, d.String()}) }); err != nil {
		t.Fatal(err)
	}
	if err := CutStream(ctx, bytes.NewReader(b), "m.gguf", int64(len(b)), p, func(off int64, c Chunk) { stream = append(stream, cut{off, c.Digest.String()}) }); err != nil {
		t.Fatal(err)
	}
	h, err := tensorheader.ReadGGUFHeader(bytes.NewReader(b), int64(len(b)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(file, stream) || len(file) < 9 || file[1].off != h.DataStart {
		t.Fatalf("CutFile %v\nCutStream %v\n(data at %d)", file, stream, h.DataStart)
	}
}
