package ociarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

// fuzzArchive is a tar of the given members (name -> bytes; a name ending
// in "/" is a directory).
func fuzzArchive(f *testing.F, members ...string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(members); i += 2 {
		name, data := members[i], members[i+1]
		h := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}
		if strings.HasSuffix(name, "/") {
			h.Typeflag, h.Size, h.Mode = tar.TypeDir, 0, 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			f.Fatal(err)
		}
		if _, err := tw.Write([]byte(data)); err != nil {
			f.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		f.Fatal(err)
	}
	return buf.Bytes()
}

// FuzzExtract extracts arbitrary bytes as an oci-archive (a file a user
// copies from anywhere): Extract must refuse it or accept it without a
// panic, and either way write nothing outside its directory, and accept no
// blob whose bytes do not hash to its name. (A member cut short is refused
// with a bare "unexpected EOF", not ErrBadArchive: a finding left to the
// package's owner, seeded in testdata/fuzz/FuzzExtract.)
func FuzzExtract(f *testing.F) {
	blob := "{}"
	f.Add(fuzzArchive(f, "oci-layout", `{"imageLayoutVersion":"1.0.0"}`, "index.json", `{"schemaVersion":2,"manifests":[]}`,
		"blobs/", "", "blobs/sha256/", "", "blobs/sha256/"+digest.FromString(blob).Encoded(), blob))
	f.Add(fuzzArchive(f, "../escape", "x", "index.json", "{}"))
	f.Add(fuzzArchive(f, "blobs/sha256/"+digest.FromString("a").Encoded(), "b"))
	f.Fuzz(func(t *testing.T, b []byte) {
		base := t.TempDir()
		dir := filepath.Join(base, "layout")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		err := Extract(context.Background(), bytes.NewReader(b), int64(len(b)), dir)
		if es, _ := os.ReadDir(base); len(es) != 1 {
			t.Fatalf("%d entries beside the layout directory", len(es))
		}
		_ = filepath.WalkDir(filepath.Join(dir, "blobs"), func(p string, d os.DirEntry, werr error) error {
			if werr != nil || !d.Type().IsRegular() || strings.HasPrefix(d.Name(), ".") {
				return nil
			}
			data, rerr := os.ReadFile(p)
			alg := filepath.Base(filepath.Dir(p))
			if rerr == nil && alg == "sha256" && digest.FromBytes(data).Encoded() != d.Name() && err == nil {
				t.Fatalf("accepted a blob %s that hashes to %s", d.Name(), digest.FromBytes(data))
			}
			return nil
		})
	})
}
