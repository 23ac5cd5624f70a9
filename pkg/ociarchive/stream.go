package ociarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// MaxHeldBlob is the largest blob a Writer reads into memory before it
// takes its turn at the tar: smaller blobs (chunks, manifests) arrive in
// parallel and are appended whole; a larger one is streamed into the tar
// while the other pushes wait.
const MaxHeldBlob = 32 << 20

// Writer is an oci-archive written while a copy runs: each blob pushed is
// appended to the tar as its member blobs/ALG/HEX (verified against its
// descriptor; a blob that fails is cut off the file again), and Commit
// adds index.json last and renames the file into place. No layout is
// staged on disk. The tar has the members Write gives a layout (oci-layout,
// the blob directories, the blobs, index.json) with the same headers, with
// the blobs in the order they were pushed.
//
// Writer is the storage a copy's destination needs: blobs and manifests
// pushed, tags, and reading back what was pushed. It cannot delete.
type Writer struct {
	path, tmp string

	mu     sync.Mutex
	f      *os.File
	tw     *tar.Writer
	dirs   map[string]bool                // blob directories written
	blobs  map[digest.Digest]storedMember // by digest
	index  ocispec.Index                  // index.json, as a layout keeps it
	failed error                          // sticky: the file is no archive
	done   bool
}

// storedMember is where a blob's bytes are in the file.
type storedMember struct {
	desc ocispec.Descriptor
	off  int64
}

// Create starts the archive path: it writes path.partial (replacing one an
// earlier run left) and renames it to path on Commit.
func Create(path string) (*Writer, error) {
	w := &Writer{path: path, tmp: path + ".partial", dirs: map[string]bool{}, blobs: map[digest.Digest]storedMember{},
		index: ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{}}}
	f, err := os.OpenFile(w.tmp, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	w.f, w.tw = f, tar.NewWriter(f)
	layoutFile, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err := w.member("oci-layout", int64(len(layoutFile)), bytes.NewReader(layoutFile)); err != nil {
		w.Abort()
		return nil, err
	}
	return w, nil
}

// member appends a regular member of n bytes read from r; w.mu is held.
func (w *Writer) member(name string, n int64, r io.Reader) error {
	if err := w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: n, Mode: 0o644,
		ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := io.Copy(w.tw, r)
	return err
}

// dir appends the directory members blobs/ and blobs/ALG/ once each.
func (w *Writer) dir(alg string) error {
	for _, name := range []string{"blobs/", "blobs/" + alg + "/"} {
		if w.dirs[name] {
			continue
		}
		if err := addDir(w.tw, name); err != nil {
			return err
		}
		w.dirs[name] = true
	}
	return nil
}

// usable returns why w can take no more, or nil; w.mu is held.
func (w *Writer) usable() error {
	switch {
	case w.failed != nil:
		return fmt.Errorf("%s: %w", w.path, w.failed)
	case w.done:
		return fmt.Errorf("%s: the archive is closed", w.path)
	}
	return nil
}

// Exists reports whether a blob with desc's digest and size was pushed.
func (w *Writer) Exists(_ context.Context, desc ocispec.Descriptor) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m, ok := w.blobs[desc.Digest]
	return ok && m.desc.Size == desc.Size, nil
}

// Push appends the blob desc, read from r and verified against desc, and
// lists a manifest in index.json (untagged, as a layout lists it). A blob
// of at most MaxHeldBlob bytes is read whole before the tar is taken.
func (w *Writer) Push(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	return w.push(ctx, desc, r, true)
}

// Store appends the blob desc as Push does, without listing a manifest in
// index.json (Update lists it).
func (w *Writer) Store(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	return w.push(ctx, desc, r, false)
}

// push appends the blob desc, and lists a manifest if list is set.
func (w *Writer) push(ctx context.Context, desc ocispec.Descriptor, r io.Reader, list bool) error {
	if err := desc.Digest.Validate(); err != nil || desc.Size < 0 {
		return fmt.Errorf("%s: push %s: %w", w.path, desc.Digest, errdef.ErrInvalidDigest)
	}
	held := desc.Size <= MaxHeldBlob
	if held {
		b, err := verify.ReadAll(r, "blob", desc)
		if err != nil {
			return fmt.Errorf("%s: push: %w", w.path, err)
		}
		r = bytes.NewReader(b)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if m, ok := w.blobs[desc.Digest]; !ok || m.desc.Size != desc.Size {
		if err := w.appendBlob(desc, r, held); err != nil {
			return err
		}
	}
	if !list {
		return nil
	}
	return w.list(desc)
}

// appendBlob writes desc's member from r, verifying it unless verified;
// on failure it cuts the file back to where the member began, so that a
// retry can follow. w.mu is held.
func (w *Writer) appendBlob(desc ocispec.Descriptor, r io.Reader, verified bool) error {
	fail := func(err error) error {
		w.failed = err
		return fmt.Errorf("%s: push %s: %w", w.path, desc.Digest, err)
	}
	if err := w.tw.Flush(); err != nil { // the padding of the member before
		return fail(err)
	}
	start, err := w.f.Seek(0, io.SeekCurrent)
	if err != nil {
		return fail(err)
	}
	alg := desc.Digest.Algorithm().String()
	had := maps.Clone(w.dirs)
	err = w.dir(alg)
	var off int64
	if err == nil {
		err = w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "blobs/" + alg + "/" + desc.Digest.Encoded(),
			Size: desc.Size, Mode: 0o644, ModTime: time.Unix(0, 0), Format: tar.FormatPAX})
	}
	if err == nil {
		off, err = w.f.Seek(0, io.SeekCurrent)
	}
	if err == nil && !verified {
		r = verify.Reader(r, "blob", desc) // io.Copy's error is nil only once every byte verified
	}
	if err == nil {
		var n int64
		if n, err = io.Copy(w.tw, r); err == nil && n != desc.Size {
			err = fmt.Errorf("%d of %d bytes", n, desc.Size)
		}
	}
	if err == nil {
		w.blobs[desc.Digest] = storedMember{desc: desc, off: off}
		return nil
	}
	// Cut the member off; the directories written with it go too.
	if terr := w.f.Truncate(start); terr != nil {
		return fail(terr)
	}
	if _, serr := w.f.Seek(start, io.SeekStart); serr != nil {
		return fail(serr)
	}
	w.tw, w.dirs = tar.NewWriter(w.f), had
	return fmt.Errorf("%s: push %s: %w", w.path, desc.Digest, err)
}

// list lists a manifest in index.json once; w.mu is held.
func (w *Writer) list(desc ocispec.Descriptor) error {
	if !isManifest(desc.MediaType) {
		return nil
	}
	for _, d := range w.index.Manifests {
		if d.Digest == desc.Digest {
			return nil
		}
	}
	d := desc
	d.Annotations = withoutRefName(d.Annotations)
	w.index.Manifests = append(w.index.Manifests, d)
	return nil
}

// Fetch reads a pushed blob back from the file.
func (w *Writer) Fetch(_ context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m, ok := w.blobs[desc.Digest]
	if !ok || w.failed != nil {
		return nil, fmt.Errorf("%s: %s: %w", w.path, desc.Digest, errdef.ErrNotFound)
	}
	return io.NopCloser(io.NewSectionReader(w.f, m.off, m.desc.Size)), nil
}

// Resolve returns the manifest a tag, or a digest, names.
func (w *Writer) Resolve(_ context.Context, ref string) (ocispec.Descriptor, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, d := range w.index.Manifests {
		if d.Annotations[ocispec.AnnotationRefName] == ref || d.Digest.String() == ref {
			return ocispec.Descriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size, ArtifactType: d.ArtifactType}, nil
		}
	}
	return ocispec.Descriptor{}, fmt.Errorf("%s: %s: %w", w.path, ref, errdef.ErrNotFound)
}

// Tag points ref at the pushed manifest desc: index.json lists it under
// the annotation org.opencontainers.image.ref.name, as a layout does.
func (w *Writer) Tag(_ context.Context, desc ocispec.Descriptor, ref string) error {
	if ref == "" {
		return errdef.ErrMissingReference
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.blobs[desc.Digest]; !ok || !isManifest(desc.MediaType) {
		return fmt.Errorf("%s: tag %s: %s: %w", w.path, ref, desc.Digest, errdef.ErrNotFound)
	}
	ms := slices.DeleteFunc(w.index.Manifests, func(d ocispec.Descriptor) bool {
		return d.Annotations[ocispec.AnnotationRefName] == ref
	})
	d := desc
	d.Annotations = map[string]string{}
	for k, v := range withoutRefName(desc.Annotations) {
		d.Annotations[k] = v
	}
	d.Annotations[ocispec.AnnotationRefName] = ref
	if i := slices.IndexFunc(ms, func(e ocispec.Descriptor) bool {
		return e.Digest == desc.Digest && e.Annotations[ocispec.AnnotationRefName] == ""
	}); i >= 0 {
		ms[i] = d
	} else {
		ms = append(ms, d)
	}
	w.index.Manifests = ms
	return nil
}

// Update lists the pushed manifests list (once each) and points each tag
// of tags at its pushed manifest, in one pass over index.json's list: the
// tags and manifests one Push per manifest and one Tag per tag, in that
// order, would leave (perhaps listed in another order), without their cost
// per tag. ctx is checked between tags;
// an error changes nothing.
func (w *Writer) Update(ctx context.Context, list []ocispec.Descriptor, tags []oci.TagRequest) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return err
	}
	last := make(map[string]int, len(tags))
	for i, r := range tags {
		if err := ctx.Err(); err != nil {
			return err
		}
		if r.Tag == "" {
			return errdef.ErrMissingReference
		}
		if _, ok := w.blobs[r.Desc.Digest]; !ok || !isManifest(r.Desc.MediaType) {
			return fmt.Errorf("%s: tag %s: %s: %w", w.path, r.Tag, r.Desc.Digest, errdef.ErrNotFound)
		}
		last[r.Tag] = i
	}
	ms := slices.Clone(w.index.Manifests)
	listed := make(map[digest.Digest]bool, len(ms))
	for _, d := range ms {
		listed[d.Digest] = true
	}
	for _, d := range list {
		if _, ok := w.blobs[d.Digest]; !ok || !isManifest(d.MediaType) {
			return fmt.Errorf("%s: list %s: %w", w.path, d.Digest, errdef.ErrNotFound)
		}
		if !listed[d.Digest] {
			d.Annotations = withoutRefName(d.Annotations)
			ms = append(ms, d)
			listed[d.Digest] = true
		}
	}
	ms = slices.DeleteFunc(ms, func(d ocispec.Descriptor) bool {
		_, moved := last[d.Annotations[ocispec.AnnotationRefName]]
		return moved
	})
	untagged := map[digest.Digest]int{}
	for i, d := range ms {
		if _, ok := untagged[d.Digest]; !ok && d.Annotations[ocispec.AnnotationRefName] == "" {
			untagged[d.Digest] = i
		}
	}
	for i, r := range tags {
		if err := ctx.Err(); err != nil {
			return err
		}
		if last[r.Tag] != i {
			continue
		}
		d := r.Desc
		d.Annotations = map[string]string{}
		for k, v := range withoutRefName(r.Desc.Annotations) {
			d.Annotations[k] = v
		}
		d.Annotations[ocispec.AnnotationRefName] = r.Tag
		if j, ok := untagged[d.Digest]; ok {
			ms[j] = d
			delete(untagged, d.Digest)
		} else {
			ms = append(ms, d)
		}
	}
	w.index.Manifests = ms
	return nil
}

// Tags lists the tags after last, sorted.
func (w *Writer) Tags(_ context.Context, last string, fn func([]string) error) error {
	w.mu.Lock()
	var tags []string
	for _, d := range w.index.Manifests {
		if t := d.Annotations[ocispec.AnnotationRefName]; t != "" && t > last {
			tags = append(tags, t)
		}
	}
	w.mu.Unlock()
	sort.Strings(tags)
	return fn(tags)
}

// Predecessors returns none: an archive being written is read by no graph
// walk (referrers are found at the source).
func (w *Writer) Predecessors(context.Context, ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	return nil, nil
}

// Delete is not supported: a member once written stays.
func (w *Writer) Delete(_ context.Context, desc ocispec.Descriptor) error {
	return fmt.Errorf("%s: delete %s: %w", w.path, desc.Digest, errdef.ErrUnsupported)
}

// Commit appends index.json, ends the tar, syncs the file and renames it
// to the archive's name; it returns the archive's size.
func (w *Writer) Commit() (int64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usable(); err != nil {
		return 0, err
	}
	w.done = true
	b, err := json.Marshal(w.index)
	if err == nil && len(w.dirs) == 0 {
		err = w.dir("sha256") // an archive of no blob still has the directories
	}
	if err == nil {
		err = w.member("index.json", int64(len(b)), bytes.NewReader(b))
	}
	if err == nil {
		err = w.tw.Close()
	}
	if err == nil {
		err = w.f.Sync()
	}
	var size int64
	if fi, serr := w.f.Stat(); serr == nil {
		size = fi.Size()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(w.tmp, w.path)
	}
	if err != nil {
		os.Remove(w.tmp)
		return 0, fmt.Errorf("%s: %w", w.path, err)
	}
	return size, nil
}

// Abort removes the partial file unless Commit succeeded.
func (w *Writer) Abort() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done && w.failed == nil {
		return
	}
	w.done = true
	w.f.Close()
	os.Remove(w.tmp)
}

// withoutRefName returns ann without the tag annotation (nil when empty).
func withoutRefName(ann map[string]string) map[string]string {
	var out map[string]string
	for k, v := range ann {
		if k != ocispec.AnnotationRefName {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}
