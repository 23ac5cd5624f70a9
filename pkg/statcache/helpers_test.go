package statcache

import (
	"bytes"
	"context"
	"path"
	"slices"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// indexOf returns the index of a tree of files (their parents as
// directories), each file cut with p, its own chunks: what a version of
// the tree holds, without the push engine (which imports this package).
func indexOf(t *testing.T, p layout.Params, files map[string][]byte) *layout.Index {
	t.Helper()
	kinds := map[string]string{}
	for f := range files {
		kinds[f] = layout.TypeFile
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			kinds[d] = layout.TypeDir
		}
	}
	paths := make([]string, 0, len(kinds))
	for q := range kinds {
		paths = append(paths, q)
	}
	slices.Sort(paths)
	ib := layout.NewIndexBuilder(layout.FormatVersion, p, len(paths))
	for _, q := range paths {
		f := layout.File{Path: q, Type: kinds[q], Mode: 0o755}
		if f.Type == layout.TypeFile {
			data := files[q]
			f.Mode, f.Size, f.Digest = 0o644, int64(len(data)), digest.FromBytes(data)
			var offs []int64
			var ds []digest.Digest
			err := layout.CutFile(context.Background(), bytes.NewReader(data), q, f.Size, p, func(off int64, d digest.Digest) {
				offs, ds = append(offs, off), append(ds, d)
			})
			if err != nil {
				t.Fatal(err)
			}
			for k, off := range offs {
				end := f.Size
				if k+1 < len(offs) {
					end = offs[k+1]
				}
				n, err := ib.ChunkNumber(layout.Chunk{Digest: ds[k], Size: end - off})
				if err != nil {
					t.Fatal(err)
				}
				f.Extents = append(f.Extents, layout.Extent{Chunk: n, Offset: 0, Length: end - off})
			}
		}
		if err := ib.Add(&f); err != nil {
			t.Fatal(err)
		}
	}
	x := ib.Index()
	if err := x.Validate(); err != nil {
		t.Fatal(err)
	}
	return x
}
