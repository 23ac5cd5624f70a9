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
	if len(m.Layers) == 0 || m.Layers[0].MediaType != mtFileIndex {
		t.Fatalf("layers[0] is not the file index: %+v", m.Layers)
	}
	ib := fetchBlob(t, tg, name, m.Layers[0].Digest)
	if digestOf(ib) != m.Layers[0].Digest || int64(len(ib)) != m.Layers[0].Size {
		t.Fatalf("file index blob does not match its descriptor")
	}
	var idx fileIndex
	mustJSON(t, ib, &idx)
	if idx.Version != 1 {
		t.Errorf("file index version = %d", idx.Version)
	}
	if len(idx.Chunks) != len(m.Layers)-1 {
		t.Fatalf("index has %d chunks, manifest %d chunk layers", len(idx.Chunks), len(m.Layers)-1)
	}
	for i, c := range idx.Chunks {
		l := m.Layers[i+1]
		if l.MediaType != mtChunk || l.Digest != c.Digest || l.Size != c.Size {
			t.Errorf("layers[%d] = %+v, index chunk %d = %+v", i+1, l, i, c)
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
