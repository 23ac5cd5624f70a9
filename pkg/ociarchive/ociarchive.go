// Package ociarchive reads and writes oci-archive files: a tar of an OCI
// image layout (oci-layout, index.json, blobs/sha256/…), the form that
// carries versions into air-gapped sites.
//
// Writing (Writer) appends each blob to the tar as a copy pushes it, with
// fixed headers, and index.json last, so that an archive cut short has no
// index; no layout is staged on disk. Reading
// extracts into a directory and accepts only the names a layout has,
// regular files only (no sparse member), never more bytes than the archive
// holds, each blob hashed as it is written and refused unless it matches
// its name: nothing of a corrupt or hostile archive reaches a destination.
package ociarchive

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// Prefix marks an archive reference: oci-archive:FILE.tar[:TAG|@DIGEST].
const Prefix = "oci-archive:"

// Limits of what Extract accepts.
const (
	maxMetaBytes = 64 << 20 // oci-layout and index.json
	maxMembers   = 1 << 22
)

// ErrBadArchive is wrapped by every refusal of an archive's contents.
var ErrBadArchive = errors.New("not a valid oci-archive")

// addDir appends a directory member with the fixed header.
func addDir(tw *tar.Writer, name string) error {
	return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatPAX})
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// Extract reads an archive of size bytes from r into the empty directory
// dir. It accepts directories, oci-layout, index.json and blobs/ALG/HEX as
// regular files; each blob must hash to its name. Any other member (a link,
// a device, a sparse file, a name outside those, a second copy of one) fails
// it with ErrBadArchive, and so does a member larger than the bytes left in
// the archive or members adding up to more than size: what is written is
// never more than the archive holds.
func Extract(ctx context.Context, r io.Reader, size int64, dir string) error {
	cr := &countingReader{r: r}
	tr := tar.NewReader(cr)
	seen := map[string]bool{}
	var total int64
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if n == maxMembers {
			return fmt.Errorf("%w: more than %d members", ErrBadArchive, maxMembers)
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrBadArchive, err)
		}
		name := strings.TrimPrefix(h.Name, "./")
		if h.Typeflag == tar.TypeDir {
			switch strings.TrimSuffix(name, "/") {
			case "", "blobs", "blobs/sha256", "blobs/sha512":
				continue
			}
			return fmt.Errorf("%w: unexpected directory %q", ErrBadArchive, h.Name)
		}
		if h.Typeflag != tar.TypeReg {
			return fmt.Errorf("%w: %q is not a regular file (type %q)", ErrBadArchive, h.Name, h.Typeflag)
		}
		// A sparse member expands to its claimed size from a few bytes:
		// none is accepted, and no member may claim more than is left.
		for k := range h.PAXRecords {
			if strings.HasPrefix(k, "GNU.sparse.") {
				return fmt.Errorf("%w: %q is a sparse file (%s)", ErrBadArchive, h.Name, k)
			}
		}
		if left := size - cr.n; h.Size > left {
			return fmt.Errorf("%w: %q claims %d bytes, the archive has %d left", ErrBadArchive, h.Name, h.Size, max(left, 0))
		}
		if total += h.Size; total > size {
			return fmt.Errorf("%w: members add up to more than the archive's %d bytes", ErrBadArchive, size)
		}
		if seen[name] {
			return fmt.Errorf("%w: %q appears twice", ErrBadArchive, h.Name)
		}
		seen[name] = true
		if err := extractMember(tr, h, name, dir); err != nil {
			return err
		}
	}
	for _, need := range []string{"oci-layout", "index.json"} {
		if !seen[need] {
			return fmt.Errorf("%w: no %s (cut short?)", ErrBadArchive, need)
		}
	}
	return nil
}

// extractMember writes one regular member, checking its name and, for a
// blob, its digest.
func extractMember(tr *tar.Reader, h *tar.Header, name, dir string) error {
	var want digest.Digest
	switch {
	case name == "oci-layout" || name == "index.json":
		if h.Size > maxMetaBytes {
			return fmt.Errorf("%w: %s is %d bytes", ErrBadArchive, name, h.Size)
		}
	case strings.HasPrefix(name, "blobs/"):
		parts := strings.Split(name, "/")
		if len(parts) != 3 {
			return fmt.Errorf("%w: unexpected member %q", ErrBadArchive, h.Name)
		}
		want = digest.NewDigestFromEncoded(digest.Algorithm(parts[1]), parts[2])
		if err := want.Validate(); err != nil {
			return fmt.Errorf("%w: %q does not name a digest: %v", ErrBadArchive, h.Name, err)
		}
	default:
		return fmt.Errorf("%w: unexpected member %q", ErrBadArchive, h.Name)
	}
	p := filepath.Join(dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	var w io.Writer = f
	var v digest.Verifier
	if want != "" {
		v = want.Verifier()
		w = io.MultiWriter(f, v)
	}
	n, err := io.Copy(w, tr)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != h.Size {
		err = fmt.Errorf("%w: %s: %d of %d bytes", ErrBadArchive, name, n, h.Size)
	}
	if err == nil && v != nil && !v.Verified() {
		err = fmt.Errorf("%w: %s: its bytes do not hash to its name", ErrBadArchive, name)
	}
	if err != nil {
		os.Remove(p)
	}
	return err
}

// Reachable returns the digests of every blob and manifest under root in
// f: the manifests, their configs and layers, and the manifests of an index,
// recursively (at most 8 levels).
func Reachable(ctx context.Context, f content.Fetcher, root ocispec.Descriptor) (map[digest.Digest]bool, error) {
	out := map[digest.Digest]bool{}
	var walk func(d ocispec.Descriptor, depth int) error
	walk = func(d ocispec.Descriptor, depth int) error {
		if out[d.Digest] {
			return nil
		}
		out[d.Digest] = true
		if !isManifest(d.MediaType) {
			return nil
		}
		if depth == 8 {
			return fmt.Errorf("%s: indexes nest more than 8 deep", root.Digest)
		}
		succ, err := content.Successors(ctx, f, d)
		if err != nil {
			return fmt.Errorf("%s: %w", d.Digest, err)
		}
		for _, s := range succ {
			if err := walk(s, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return out, walk(root, 0)
}

func isManifest(mt string) bool {
	switch mt {
	case ocispec.MediaTypeImageManifest, ocispec.MediaTypeImageIndex,
		"application/vnd.docker.distribution.manifest.v2+json", "application/vnd.docker.distribution.manifest.list.v2+json":
		return true
	}
	return false
}
