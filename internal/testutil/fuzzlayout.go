package testutil

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Placeholders a fuzzed layout uses to name its own blobs, which the
// fuzzer could not guess the digests of.
const (
	PhBlobDigest     = "@BD@"
	PhBlobSize       = "@BS@"
	PhManifestDigest = "@MD@"
	PhManifestSize   = "@MS@"
	PhDataDigest     = "@DD@"
	PhDataSize       = "@DS@"
)

// BuildFuzzLayout writes an OCI layout to dir: data as is, blob with the
// data's placeholders filled in, manifest with the blob's and the data's,
// index.json with all three's. The data blob (a chunk or an index piece) is
// written only when there is one.
func BuildFuzzLayout(t testing.TB, dir string, index, manifest, blob []byte, data ...[]byte) {
	t.Helper()
	var dataBlob []byte
	if len(data) > 0 {
		dataBlob = data[0]
	}
	fill := func(b []byte, rs [][2]string) []byte {
		for _, r := range rs {
			b = bytes.ReplaceAll(b, []byte(r[0]), []byte(r[1]))
		}
		return b
	}
	dd := digest.FromBytes(dataBlob)
	rs := [][2]string{{PhDataDigest, string(dd)}, {PhDataSize, strconv.Itoa(len(dataBlob))}}
	blob = fill(blob, rs)
	bd := digest.FromBytes(blob)
	rs = append(rs, [2]string{PhBlobDigest, string(bd)}, [2]string{PhBlobSize, strconv.Itoa(len(blob))})
	manifest = fill(manifest, rs)
	md := digest.FromBytes(manifest)
	index = fill(index, append(rs, [2]string{PhManifestDigest, string(md)}, [2]string{PhManifestSize, strconv.Itoa(len(manifest))}))
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		filepath.Join(dir, ocispec.ImageLayoutFile):                        []byte(`{"imageLayoutVersion":"1.0.0"}`),
		filepath.Join(dir, ocispec.ImageIndexFile):                         index,
		filepath.Join(blobs, bd.Encoded()):                                 blob,
		filepath.Join(blobs, md.Encoded()):                                 manifest,
		filepath.Join(blobs, ocispec.DescriptorEmptyJSON.Digest.Encoded()): []byte("{}"),
	}
	if len(data) > 0 {
		files[filepath.Join(blobs, dd.Encoded())] = dataBlob
	}
	for p, b := range files {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Placeholders rewrites b with the placeholders of the descriptor of blob
// (its digest, and its size where it follows the digest, as in a
// descriptor, a chunk or a piece reference).
func Placeholders(b, blob []byte, ds, ss string) []byte {
	d := digest.FromBytes(blob)
	b = bytes.ReplaceAll(b, []byte(`"`+d+`","size":`+digest.Digest(strconv.Itoa(len(blob)))), []byte(`"`+ds+`","size":`+ss))
	return bytes.ReplaceAll(b, []byte(d), []byte(ds))
}
