package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Media types of the bdnvol format and of OCI.
const (
	mtManifest      = "application/vnd.oci.image.manifest.v1+json"
	mtIndex         = "application/vnd.oci.image.index.v1+json"
	mtEmpty         = "application/vnd.oci.empty.v1+json"
	mtVolume        = "application/vnd.bdnvol.volume.v1"
	mtFileIndex     = "application/vnd.bdnvol.index.v1+json"
	mtTopIndex      = "application/vnd.bdnvol.index.v2+json"
	mtPiece         = "application/vnd.bdnvol.index.piece.v2+json"
	mtChunk         = "application/vnd.bdnvol.chunk.v1"
	emptyDigest     = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
	manifestAccepts = mtManifest + ", " + mtIndex
)

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType    string `json:"mediaType"`
	ArtifactType string `json:"artifactType,omitempty"`
	Digest       string `json:"digest"`
	Size         int64  `json:"size"`
}

// ociManifest covers both image manifests and image indexes.
type ociManifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	ArtifactType  string            `json:"artifactType,omitempty"`
	Config        *descriptor       `json:"config,omitempty"`
	Layers        []descriptor      `json:"layers,omitempty"`
	Manifests     []descriptor      `json:"manifests,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// --- the bdnvol file index, for crafting versions by hand ---

type fileIndex struct {
	Version  int          `json:"version"`
	Chunking chunking     `json:"chunking"`
	Chunks   []chunkRef   `json:"chunks"`
	Files    []indexEntry `json:"files"`
}

type chunking struct {
	Min int64 `json:"min"`
	Avg int64 `json:"avg"`
	Max int64 `json:"max"`
}

type chunkRef struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

type indexEntry struct {
	Path    string     `json:"path"`
	Type    string     `json:"type"`
	Mode    uint32     `json:"mode"`
	Size    int64      `json:"size,omitempty"`
	Digest  string     `json:"digest,omitempty"`
	Target  string     `json:"target,omitempty"`
	Extents [][3]int64 `json:"extents,omitempty"`
}

// version is a crafted volume: the blobs and the root manifest.
type version struct {
	blobs    map[string][]byte // digest -> content, config, index and chunks
	manifest []byte
	digest   string // of manifest
	index    fileIndex
}

// craft builds a single-manifest version from an index and chunk contents;
// idx.Chunks is filled in from chunks.
func craft(t testing.TB, idx fileIndex, chunks [][]byte) version {
	t.Helper()
	return craftWith(t, idx, chunks, nil)
}

// craftWith is craft with a chance to change the root manifest before it is
// serialized.
func craftWith(t testing.TB, idx fileIndex, chunks [][]byte, mutate func(*ociManifest)) version {
	t.Helper()
	if idx.Version == 0 {
		idx.Version = 1
	}
	if idx.Chunking == (chunking{}) {
		idx.Chunking = chunking{Min: 1 << 20, Avg: 4 << 20, Max: 8 << 20}
	}
	idx.Chunks = []chunkRef{}
	v := version{blobs: map[string][]byte{emptyDigest: []byte("{}")}}
	for _, c := range chunks {
		d := digestOf(c)
		idx.Chunks = append(idx.Chunks, chunkRef{Digest: d, Size: int64(len(c))})
		v.blobs[d] = c
	}
	if idx.Files == nil {
		idx.Files = []indexEntry{}
	}
	ib, err := json.Marshal(idx)
	if err != nil {
		t.Fatal(err)
	}
	v.blobs[digestOf(ib)] = ib
	m := ociManifest{
		SchemaVersion: 2,
		MediaType:     mtManifest,
		ArtifactType:  mtVolume,
		Config:        &descriptor{MediaType: mtEmpty, Digest: emptyDigest, Size: 2},
		Layers:        []descriptor{{MediaType: mtFileIndex, Digest: digestOf(ib), Size: int64(len(ib))}},
	}
	for _, c := range idx.Chunks {
		m.Layers = append(m.Layers, descriptor{MediaType: mtChunk, Digest: c.Digest, Size: c.Size})
	}
	if mutate != nil {
		mutate(&m)
	}
	v.manifest, err = json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	v.digest = digestOf(v.manifest)
	v.index = idx
	return v
}

// fileEntry is an index entry for a file stored whole in chunk ci at offset 0.
func fileEntry(path string, mode uint32, data []byte, ci int64) indexEntry {
	e := indexEntry{Path: path, Type: "file", Mode: mode, Size: int64(len(data)), Digest: digestOf(data)}
	if len(data) > 0 {
		e.Extents = [][3]int64{{ci, 0, int64(len(data))}}
	}
	return e
}

// --- plain HTTP OCI distribution client ---

// uploadBlob pushes a blob with POST + PUT ?digest=.
func uploadBlob(t testing.TB, reg *registry, repo string, data []byte) string {
	t.Helper()
	d := digestOf(data)
	resp, err := http.Post(reg.URL+"/v2/"+repo+"/blobs/uploads/", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("POST blob upload to %s: %s", repo, resp.Status)
	}
	loc, err := resp.Location()
	if err != nil {
		t.Fatalf("POST blob upload: no Location: %v", err)
	}
	q := loc.Query()
	q.Set("digest", d)
	loc.RawQuery = q.Encode()
	req, err := http.NewRequest(http.MethodPut, loc.String(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.ContentLength = int64(len(data))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT blob %s to %s: %s %s", d, repo, resp.Status, body)
	}
	return d
}

// putManifest uploads a manifest under ref (a tag or digest).
func putManifest(t testing.TB, reg *registry, repo, ref, mediaType string, data []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, reg.URL+"/v2/"+repo+"/manifests/"+ref, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", mediaType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT manifest %s:%s: %s %s", repo, ref, resp.Status, body)
	}
}

// getManifest fetches a manifest with the given Accept header, returning the
// body and its Content-Type.
func getManifest(t testing.TB, reg *registry, repo, ref, accept string) ([]byte, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, reg.URL+"/v2/"+repo+"/manifests/"+url.PathEscape(ref), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET manifest %s@%s: %s %s", repo, ref, resp.Status, body)
	}
	return body, resp.Header.Get("Content-Type")
}

// getBlob fetches a blob.
func getBlob(t testing.TB, reg *registry, repo, digest string) []byte {
	t.Helper()
	resp, err := http.Get(reg.URL + "/v2/" + repo + "/blobs/" + digest)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET blob %s@%s: %s", repo, digest, resp.Status)
	}
	return body
}

// pushVersion uploads a crafted version to a registry and tags it.
func pushVersion(t testing.TB, reg *registry, repo, tag string, v version) {
	t.Helper()
	for _, b := range v.blobs {
		uploadBlob(t, reg, repo, b)
	}
	putManifest(t, reg, repo, tag, mtManifest, v.manifest)
}

// --- OCI image layouts ---

// writeLayout writes a crafted version into an OCI image layout at dir,
// tagged tag (org.opencontainers.image.ref.name).
func writeLayout(t testing.TB, dir, tag string, v version) {
	t.Helper()
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	put := func(b []byte) {
		if err := os.WriteFile(filepath.Join(blobs, strings.TrimPrefix(digestOf(b), "sha256:")), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range v.blobs {
		put(b)
	}
	put(v.manifest)
	mustWrite(t, filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`))
	type refDescriptor struct {
		descriptor
		Annotations map[string]string `json:"annotations"`
	}
	ib, err := json.Marshal(struct {
		SchemaVersion int             `json:"schemaVersion"`
		MediaType     string          `json:"mediaType"`
		Manifests     []refDescriptor `json:"manifests"`
	}{2, mtIndex, []refDescriptor{{
		descriptor:  descriptor{MediaType: mtManifest, ArtifactType: mtVolume, Digest: v.digest, Size: int64(len(v.manifest))},
		Annotations: map[string]string{"org.opencontainers.image.ref.name": tag},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, "index.json"), ib)
}

// layoutBlob reads a blob (or manifest) of an OCI layout.
func layoutBlob(t testing.TB, dir, digest string) []byte {
	t.Helper()
	alg, hexd, ok := strings.Cut(digest, ":")
	if !ok {
		t.Fatalf("bad digest %q", digest)
	}
	b, err := os.ReadFile(filepath.Join(dir, "blobs", alg, hexd))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fetchManifest returns the manifest with the given digest from a target.
func fetchManifest(t testing.TB, tg target, name, digest string) []byte {
	t.Helper()
	if tg.reg != nil {
		b, _ := getManifest(t, tg.reg, name, digest, manifestAccepts)
		return b
	}
	return layoutBlob(t, filepath.Join(tg.root, name), digest)
}

// fetchBlob returns a blob from a target.
func fetchBlob(t testing.TB, tg target, name, digest string) []byte {
	t.Helper()
	if tg.reg != nil {
		return getBlob(t, tg.reg, name, digest)
	}
	return layoutBlob(t, filepath.Join(tg.root, name), digest)
}

func mustWrite(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustJSON(t testing.TB, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
}
