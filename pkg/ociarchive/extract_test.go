package ociarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
)

// fileSize returns the size of the open file f.
func fileSize(t *testing.T, f *os.File) int64 {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// sparseRealSize is what the sparse member below claims to expand to.
const sparseRealSize = 1 << 40

// tarBlock returns b padded to a whole number of 512-byte tar blocks.
func tarBlock(b []byte) []byte {
	return append(b, make([]byte, (512-len(b)%512)%512)...)
}

// ustarHeader returns a 512-byte ustar header of one member.
func ustarHeader(name string, typ byte, size int64) []byte {
	h := make([]byte, 512)
	copy(h[0:], name)
	copy(h[100:], "0000644\x00")
	copy(h[108:], "0000000\x00")
	copy(h[116:], "0000000\x00")
	copy(h[124:], fmt.Sprintf("%011o\x00", size))
	copy(h[136:], "00000000000\x00")
	h[156] = typ
	copy(h[257:], "ustar\x0000")
	copy(h[148:], "        ")
	var sum int
	for _, c := range h {
		sum += int(c)
	}
	copy(h[148:], fmt.Sprintf("%06o\x00 ", sum))
	return h
}

// paxRecord formats one PAX record, its length counting itself.
func paxRecord(k, v string) string {
	rest := " " + k + "=" + v + "\n"
	n := len(rest) + 1
	for len(fmt.Sprint(n))+len(rest) != n {
		n++
	}
	return fmt.Sprint(n) + rest
}

// sparseArchive returns an archive of a few KiB: oci-layout, index.json and
// a blob member that is a GNU sparse file (PAX format 1.0) of realsize
// sparseRealSize holding one byte of data at its end, padded with other
// members to about 20 KB.
func sparseArchive(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range []struct{ name, body string }{
		{"oci-layout", `{"imageLayoutVersion":"1.0.0"}`},
	} {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: m.name, Size: int64(len(m.body)), Mode: 0o644, Format: tar.FormatPAX})
		tw.Write([]byte(m.body))
	}
	tw.Flush()
	name := "blobs/sha256/" + digest.FromString("x").Encoded()
	pax := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", name) + paxRecord("GNU.sparse.realsize", fmt.Sprint(sparseRealSize))
	buf.Write(ustarHeader("PaxHeaders/blob", 'x', int64(len(pax))))
	buf.Write(tarBlock([]byte(pax)))
	sparseMap := tarBlock([]byte(fmt.Sprintf("1\n%d\n1\n", sparseRealSize-1)))
	data := tarBlock([]byte{'x'})
	buf.Write(ustarHeader("GNUSparseFile.0/blob", '0', int64(len(sparseMap)+1)))
	buf.Write(sparseMap)
	buf.Write(data)
	buf.Write(make([]byte, 20<<10)) // end of archive, and bulk
	return buf.Bytes()
}

// dirBytes sums the sizes of the files under dir.
func dirBytes(t *testing.T, dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// A sparse member that claims a TiB from a 20 KB archive is refused before
// a byte of it is written; so is a plain member claiming more bytes than the
// archive has left. Nothing larger than the archive is written.
func TestExtractRefusesExpansion(t *testing.T) {
	ctx := context.Background()
	sparse := sparseArchive(t)
	// The archive reads as a sparse file of sparseRealSize bytes.
	tr := tar.NewReader(bytes.NewReader(sparse))
	tr.Next()
	if h, err := tr.Next(); err != nil || h.Size != sparseRealSize {
		t.Fatalf("the test archive's sparse member: %+v, %v", h, err)
	}

	var huge bytes.Buffer
	huge.Write(ustarHeader("blobs/sha256/"+digest.FromString("y").Encoded(), '0', 1<<40))
	huge.Write(make([]byte, 20<<10))

	for _, tc := range []struct {
		name, want string
		b          []byte
	}{
		{"sparse", "sparse file", sparse},
		{"larger than the archive", "the archive has", huge.Bytes()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			err := Extract(ctx, bytes.NewReader(tc.b), int64(len(tc.b)), dir)
			if !errors.Is(err, ErrBadArchive) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("extract of a %d-byte archive: %v; want %q", len(tc.b), err, tc.want)
			}
			if n := dirBytes(t, dir); n > int64(len(tc.b)) {
				t.Errorf("a %d-byte archive wrote %d bytes", len(tc.b), n)
			}
		})
	}
}
