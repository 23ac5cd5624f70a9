package e2e

import (
	"path"
	"sort"
	"testing"
)

// checkRoot fetches the root manifest of a pushed version and checks it
// against the format: an image manifest (or, for big volumes, an image index)
// with the bdnvol artifactType. For a single manifest it also checks the
// config, the layer media types, that layers[1..] are exactly the index's
// chunks, and the file index's own invariants; it returns the manifest and
// (for a single manifest) the file index.
func checkRoot(t testing.TB, tg target, name, digest string) (ociManifest, *fileIndex) {
	t.Helper()
	raw := fetchManifest(t, tg, name, digest)
	if got := digestOf(raw); got != digest {
		t.Fatalf("manifest %s has digest %s", digest, got)
	}
	var m ociManifest
	mustJSON(t, raw, &m)
	if m.ArtifactType != mtVolume {
		t.Errorf("root artifactType = %q, want %q", m.ArtifactType, mtVolume)
	}
	switch m.MediaType {
	case mtIndex:
		if len(m.Manifests) == 0 {
			t.Errorf("root index has no manifests")
		}
		for _, d := range m.Manifests {
			fetchManifest(t, tg, name, d.Digest)
		}
		return m, nil
	case mtManifest:
	default:
		t.Fatalf("root mediaType = %q", m.MediaType)
	}
	if m.Config == nil || *m.Config != (descriptor{MediaType: mtEmpty, Digest: emptyDigest, Size: 2}) {
		t.Errorf("config = %+v, want the OCI empty descriptor", m.Config)
	}
	if len(m.Layers) == 0 || (m.Layers[0].MediaType != mtFileIndex && m.Layers[0].MediaType != mtTopIndex) {
		t.Fatalf("layers[0] is not the file index: %+v", m.Layers)
	}
	ib := fetchBlob(t, tg, name, m.Layers[0].Digest)
	if digestOf(ib) != m.Layers[0].Digest || int64(len(ib)) != m.Layers[0].Size {
		t.Fatalf("file index blob does not match its descriptor")
	}
	var idx fileIndex
	chunkLayers := m.Layers[1:]
	if m.Layers[0].MediaType == mtTopIndex {
		// Format version 2: the pieces follow the top-level index.
		var top topIndex
		mustJSON(t, ib, &top)
		if top.Version != 2 || len(m.Layers) < 1+len(top.Pieces) {
			t.Fatalf("top-level index version %d with %d pieces, %d layers", top.Version, len(top.Pieces), len(m.Layers))
		}
		var pieces [][]byte
		for i, p := range top.Pieces {
			l := m.Layers[1+i]
			if l.MediaType != mtPiece || l.Digest != p.Digest || l.Size != p.Size {
				t.Fatalf("layers[%d] = %+v, piece %d = %+v", 1+i, l, i, p)
			}
			pb := fetchBlob(t, tg, name, p.Digest)
			if digestOf(pb) != p.Digest {
				t.Fatalf("piece %s does not match its digest", p.Digest)
			}
			pieces = append(pieces, pb)
		}
		idx = assembleV2(t, top, pieces)
		chunkLayers = m.Layers[1+len(top.Pieces):]
	} else {
		mustJSON(t, ib, &idx)
		if idx.Version != 1 {
			t.Errorf("file index version = %d", idx.Version)
		}
	}
	if len(idx.Chunks) != len(chunkLayers) {
		t.Fatalf("index has %d chunks, manifest %d chunk layers", len(idx.Chunks), len(chunkLayers))
	}
	for i, c := range idx.Chunks {
		l := chunkLayers[i]
		if l.MediaType != mtChunk || l.Digest != c.Digest || l.Size != c.Size {
			t.Errorf("chunk layer %d = %+v, index chunk %d = %+v", i, l, i, c)
		}
	}
	checkIndex(t, idx)
	return m, &idx
}

// checkIndex checks a file index's invariants: sorted, unique paths, parents
// listed as dirs first, extents inside their chunks and adding up to the size.
func checkIndex(t testing.TB, idx fileIndex) {
	t.Helper()
	paths := make([]string, len(idx.Files))
	types := map[string]string{}
	for i, f := range idx.Files {
		paths[i] = f.Path
		if _, dup := types[f.Path]; dup {
			t.Errorf("duplicate path %q", f.Path)
		}
		if dir := path.Dir(f.Path); dir != "." && types[dir] != "dir" {
			t.Errorf("%q listed before its parent directory", f.Path)
		}
		types[f.Path] = f.Type
		switch f.Type {
		case "file":
			var n int64
			for _, e := range f.Extents {
				if e[0] < 0 || e[0] >= int64(len(idx.Chunks)) || e[1] < 0 || e[2] <= 0 || e[1]+e[2] > idx.Chunks[e[0]].Size {
					t.Errorf("%q: bad extent %v", f.Path, e)
				}
				n += e[2]
			}
			if n != f.Size || !digestRE.MatchString(f.Digest) {
				t.Errorf("%q: extents cover %d bytes, size %d, digest %q", f.Path, n, f.Size, f.Digest)
			}
		case "dir":
		case "symlink":
			if f.Target == "" {
				t.Errorf("%q: symlink without target", f.Path)
			}
		default:
			t.Errorf("%q: type %q", f.Path, f.Type)
		}
	}
	if !sort.StringsAreSorted(paths) {
		t.Errorf("files are not sorted by path: %q", paths)
	}
}

// topIndex is the top-level index of format version 2.
type topIndex struct {
	Version int   `json:"version"`
	Entries int64 `json:"entries"`
	Bytes   int64 `json:"bytes"`
	Chunks  int64 `json:"chunks"`
	Pieces  []struct {
		Digest  string `json:"digest"`
		Size    int64  `json:"size"`
		First   string `json:"first"`
		Entries int64  `json:"entries"`
		Bytes   int64  `json:"bytes"`
	} `json:"pieces"`
}

// assembleV2 joins the pieces of a version 2 index into the one-blob form
// (version 1's numbering of chunks: in order of first use), checking each
// piece against the top-level index as docs/format.md says.
func assembleV2(t testing.TB, top topIndex, pieces [][]byte) fileIndex {
	t.Helper()
	idx := fileIndex{Version: 2, Files: []indexEntry{}}
	global := map[string]int64{}
	var entries, bytes int64
	for i, pb := range pieces {
		var p struct {
			Chunks []chunkRef   `json:"chunks"`
			Files  []indexEntry `json:"files"`
		}
		mustJSON(t, pb, &p)
		ref := top.Pieces[i]
		if int64(len(p.Files)) != ref.Entries || len(p.Files) == 0 || p.Files[0].Path != ref.First {
			t.Fatalf("piece %s: %d entries from %q, the top-level index says %d from %q", ref.Digest, len(p.Files), p.Files[0].Path, ref.Entries, ref.First)
		}
		var pbytes int64
		for _, f := range p.Files {
			pbytes += f.Size
			for k, e := range f.Extents {
				if e[0] < 0 || e[0] >= int64(len(p.Chunks)) {
					t.Fatalf("piece %s: %q names chunk %d of %d", ref.Digest, f.Path, e[0], len(p.Chunks))
				}
				c := p.Chunks[e[0]]
				g, ok := global[c.Digest]
				if !ok {
					g = int64(len(idx.Chunks))
					global[c.Digest] = g
					idx.Chunks = append(idx.Chunks, c)
				}
				f.Extents[k][0] = g
			}
			idx.Files = append(idx.Files, f)
		}
		if pbytes != ref.Bytes {
			t.Errorf("piece %s holds %d bytes, the top-level index says %d", ref.Digest, pbytes, ref.Bytes)
		}
		entries += ref.Entries
		bytes += pbytes
	}
	if entries != top.Entries || bytes != top.Bytes || int64(len(idx.Chunks)) != top.Chunks {
		t.Errorf("pieces hold %d entries, %d bytes, %d chunks; the top-level index says %d, %d, %d",
			entries, bytes, len(idx.Chunks), top.Entries, top.Bytes, top.Chunks)
	}
	return idx
}
