package oci

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
	"github.com/bdnvol/bdnvol/internal/verify"
)

func stampOf(fi os.FileInfo) fileStamp {
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.dev, st.ino = uint64(sys.Dev), sys.Ino
	}
	return st
}

// read returns the current index: the cached one while index.json has not
// changed. It creates nothing; a layout without index.json has no tags.
func (s *layoutStore) read(ctx context.Context) (*layoutIndex, error) {
	fi, err := os.Lstat(s.path(ocispec.ImageIndexFile))
	if errors.Is(err, fs.ErrNotExist) {
		return parseIndex(s.root, nil)
	}
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	x, stamp := s.cached, s.stamp
	s.mu.Unlock()
	if x != nil && stamp == stampOf(fi) {
		return x, nil
	}
	unlock, err := s.lock(ctx, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return s.load()
}

// load reads and parses index.json and caches the result, which no one
// may change.
func (s *layoutStore) load() (*layoutIndex, error) {
	x, fi, err := s.loadFresh()
	if err != nil || fi == nil {
		return x, err
	}
	s.mu.Lock()
	s.cached, s.stamp = x, stampOf(fi)
	s.mu.Unlock()
	return x, nil
}

// loadFresh reads and parses index.json into an index of the caller's own;
// the file's information is nil when there is no index.json.
func (s *layoutStore) loadFresh() (*layoutIndex, os.FileInfo, error) {
	b, fi, err := s.readSmall(ocispec.ImageIndexFile, MaxLayoutIndexBytes)
	if errors.Is(err, fs.ErrNotExist) {
		x, err := parseIndex(s.root, nil)
		return x, nil, err
	}
	if err != nil {
		return nil, nil, err
	}
	x, err := parseIndex(s.root, b)
	if err != nil {
		return nil, nil, err
	}
	return x, fi, nil
}

// lock takes the index lock, exclusive for writers. A reader does not
// create the lock file: without one, or without the right to open it, it
// reads unlocked (index.json is only ever replaced whole). Waiting ends with
// ctx.
func (s *layoutStore) lock(ctx context.Context, exclusive bool) (func(), error) {
	p := s.path(indexLockName)
	flags, how := os.O_RDONLY, syscall.LOCK_SH
	if exclusive {
		flags, how = os.O_RDWR|os.O_CREATE, syscall.LOCK_EX
	}
	f, err := os.OpenFile(p, flags|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		switch {
		case errors.Is(err, syscall.ELOOP):
			return nil, fmt.Errorf("%s: %w: a symlink", p, ErrInvalidLayout)
		case !exclusive && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)):
			return func() {}, nil
		}
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w: not a regular file", p, ErrInvalidLayout)
	}
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", s.root, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", s.root, ctx.Err())
		case <-time.After(wait):
		}
	}
	return func() { f.Close() }, nil // closing releases the lock
}

// write changes index.json: fn gets a freshly loaded index under the
// exclusive lock and reports whether it changed it.
func (s *layoutStore) write(ctx context.Context, fn func(*layoutIndex) (bool, error)) error {
	unlock, err := s.lock(ctx, true)
	if err != nil {
		return err
	}
	defer unlock()
	x, _, err := s.loadFresh()
	if err != nil {
		return err
	}
	changed, err := fn(x)
	if err != nil || !changed {
		return err
	}
	if x.doc.SchemaVersion == 0 {
		x.doc.SchemaVersion = 2
	}
	if x.doc.MediaType == "" {
		x.doc.MediaType = ocispec.MediaTypeImageIndex
	}
	if x.doc.Manifests == nil {
		x.doc.Manifests = []ocispec.Descriptor{}
	}
	b, err := json.Marshal(x.doc)
	if err != nil {
		return err
	}
	if err := s.replace(ocispec.ImageIndexFile, b); err != nil {
		return err
	}
	indexWrites.Add(1)
	_, err = s.load()
	return err
}

// indexWrites counts the rewrites of index.json, of every layout (for tests).
var indexWrites atomic.Int64

// replace writes b to the layout file name through a temporary file and a
// rename, so that readers see the old file or the new one, never a part.
func (s *layoutStore) replace(name string, b []byte) error {
	if err := atomicfile.WriteFile(s.path(name), b, 0o644); err != nil {
		return fmt.Errorf("%s: write %s: %w", s.root, name, err)
	}
	return nil
}

// parseIndex decodes index.json (nil: none), refusing a key given twice or
// in another case than the format's (see checkKeys), and sorts its descriptors into
// usable ones and the others, which are kept but never resolved.
func parseIndex(root string, b []byte) (*layoutIndex, error) {
	x := &layoutIndex{
		doc:     ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex},
		tags:    map[string]ocispec.Descriptor{},
		bad:     map[string]error{},
		digests: map[digest.Digest]ocispec.Descriptor{},
	}
	if b != nil {
		x.doc = ocispec.Index{}
		if err := json.Unmarshal(b, &x.doc); err != nil {
			return nil, fmt.Errorf("%s: %s: %w: %v", root, ocispec.ImageIndexFile, ErrInvalidLayout, err)
		}
		if err := checkKeys(b, indexKeys); err != nil {
			return nil, fmt.Errorf("%s: %s: %w: %v", root, ocispec.ImageIndexFile, ErrInvalidLayout, err)
		}
	}
	x.index()
	return x, nil
}

// index rebuilds the lookup maps from doc. When two descriptors carry one
// tag, the later wins, as in other OCI tools.
func (x *layoutIndex) index() {
	clear(x.tags)
	clear(x.bad)
	clear(x.digests)
	for _, d := range x.doc.Manifests {
		tag := d.Annotations[ocispec.AnnotationRefName]
		if err := checkManifestDesc(d); err != nil {
			if tag != "" {
				x.bad[tag] = err
				delete(x.tags, tag)
			}
			continue
		}
		if _, ok := x.digests[d.Digest]; !ok {
			x.digests[d.Digest] = plain(d)
		}
		if tag != "" {
			x.tags[tag] = d
			delete(x.bad, tag)
		}
	}
}

// checkManifestDesc checks a descriptor of index.json names a manifest
// that may be read: a valid digest, a known media type, a size a manifest
// may have.
func checkManifestDesc(d ocispec.Descriptor) error {
	if err := d.Digest.Validate(); err != nil {
		return fmt.Errorf("descriptor %q: %w: %v", d.Digest, ErrInvalidLayout, err)
	}
	if !IsManifest(d.MediaType) {
		return fmt.Errorf("descriptor %s: %w: media type %q is not a manifest's", d.Digest, ErrInvalidLayout, d.MediaType)
	}
	if d.Size <= 0 || d.Size > MaxManifestBytes {
		return fmt.Errorf("descriptor %s: %w: manifest of %d bytes (at most %d)", d.Digest, ErrInvalidLayout, d.Size, MaxManifestBytes)
	}
	return nil
}

// plain returns d without annotations and other optional fields.
func plain(d ocispec.Descriptor) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size}
}

func withoutRefName(ann map[string]string) map[string]string {
	if _, ok := ann[ocispec.AnnotationRefName]; !ok {
		return ann
	}
	out := make(map[string]string, len(ann))
	for k, v := range ann {
		if k != ocispec.AnnotationRefName {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// Resolve returns the descriptor a tag or digest names.
func (s *layoutStore) Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error) {
	if ref == "" {
		return ocispec.Descriptor{}, errdef.ErrMissingReference
	}
	x, err := s.read(ctx)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	if d, ok := x.tags[ref]; ok {
		return d, nil
	}
	if err := x.bad[ref]; err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("%s: tag %s: %w", s.root, ref, err)
	}
	d, err := digest.Parse(ref)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("%s: %s: %w", s.root, ref, errdef.ErrNotFound)
	}
	if desc, ok := x.digests[d]; ok {
		return desc, nil
	}
	return s.resolveBlob(d)
}

// resolveBlob describes a blob that index.json does not list: a manifest
// (found by its media type) or an opaque blob.
func (s *layoutStore) resolveBlob(d digest.Digest) (ocispec.Descriptor, error) {
	p, err := s.blobPath(d)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return ocispec.Descriptor{}, fmt.Errorf("%s: %s: %w", s.root, d, errdef.ErrNotFound)
	}
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: "application/octet-stream", Digest: d, Size: fi.Size()}
	if !fi.Mode().IsRegular() {
		return ocispec.Descriptor{}, fmt.Errorf("%s: blob %s: %w: not a regular file", s.root, d, ErrInvalidLayout)
	}
	if fi.Size() > 0 && fi.Size() <= MaxManifestBytes {
		if b, err := s.fetchManifest(desc); err == nil {
			var m struct {
				MediaType string `json:"mediaType"`
			}
			if json.Unmarshal(b, &m) == nil && IsManifest(m.MediaType) {
				desc.MediaType = m.MediaType
			}
		}
	}
	return desc, nil
}

// fetchManifest reads and verifies the manifest desc (at most MaxManifestBytes).
func (s *layoutStore) fetchManifest(desc ocispec.Descriptor) ([]byte, error) {
	if desc.Size <= 0 || desc.Size > MaxManifestBytes {
		return nil, fmt.Errorf("%s: manifest %s: %w: %d bytes", s.root, desc.Digest, ErrInvalidLayout, desc.Size)
	}
	f, err := s.openBlob(desc)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, desc.Size)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, fmt.Errorf("%s: manifest %s: %w", s.root, desc.Digest, err)
	}
	if err := verify.Bytes("manifest", b, desc); err != nil {
		return nil, fmt.Errorf("%s: %w", s.root, err)
	}
	return b, nil
}

// Tag points ref at desc, which must be stored.
func (s *layoutStore) Tag(ctx context.Context, desc ocispec.Descriptor, ref string) error {
	if ref == "" {
		return errdef.ErrMissingReference
	}
	if err := checkManifestDesc(desc); err != nil {
		return fmt.Errorf("%s: tag %s: %w", s.root, ref, err)
	}
	ok, err := s.Exists(ctx, desc)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s: %s: %w", s.root, desc.Digest, errdef.ErrNotFound)
	}
	return s.write(ctx, func(x *layoutIndex) (bool, error) {
		ms := slices.DeleteFunc(x.doc.Manifests, func(d ocispec.Descriptor) bool {
			return d.Annotations[ocispec.AnnotationRefName] == ref
		})
		d := desc
		if ref != desc.Digest.String() {
			d.Annotations = withoutRefName(d.Annotations)
			ann := make(map[string]string, len(d.Annotations)+1)
			for k, v := range d.Annotations {
				ann[k] = v
			}
			ann[ocispec.AnnotationRefName] = ref
			d.Annotations = ann
		}
		// A manifest listed untagged is listed once, tagged.
		i := slices.IndexFunc(ms, func(e ocispec.Descriptor) bool {
			return e.Digest == desc.Digest && e.Annotations[ocispec.AnnotationRefName] == ""
		})
		switch {
		case i >= 0 && ref == desc.Digest.String():
		case i >= 0:
			ms[i] = d
		default:
			ms = append(ms, d)
		}
		x.doc.Manifests = ms
		x.index()
		return true, nil
	})
}

// Update lists the stored manifests list (untagged, unless listed already)
// and points each tag of tags at its manifest, which must be stored, in one
// rewrite of index.json: the tags and manifests one Push per manifest and
// one Tag per tag, in that order, would leave (perhaps listed in another
// order). ctx is checked between requests.
func (s *layoutStore) Update(ctx context.Context, list []ocispec.Descriptor, tags []TagRequest) error {
	stored := map[digest.Digest]bool{}
	check := func(d ocispec.Descriptor, what string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := checkManifestDesc(d); err != nil {
			return fmt.Errorf("%s: %s: %w", s.root, what, err)
		}
		if stored[d.Digest] {
			return nil
		}
		ok, err := s.Exists(ctx, d)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s: %s: %s: %w", s.root, what, d.Digest, errdef.ErrNotFound)
		}
		stored[d.Digest] = true
		return nil
	}
	for _, d := range list {
		if err := check(d, "list"); err != nil {
			return err
		}
	}
	last := make(map[string]int, len(tags)) // the request that wins, by tag
	for i, r := range tags {
		if r.Tag == "" {
			return errdef.ErrMissingReference
		}
		if err := check(r.Desc, "tag "+r.Tag); err != nil {
			return err
		}
		last[r.Tag] = i
	}
	if len(list) == 0 && len(tags) == 0 {
		return nil
	}
	return s.write(ctx, func(x *layoutIndex) (bool, error) {
		ms := x.doc.Manifests
		listed := make(map[digest.Digest]bool, len(ms))
		for _, d := range ms {
			listed[d.Digest] = true
		}
		for _, d := range list {
			if !listed[d.Digest] {
				d.Annotations = withoutRefName(d.Annotations)
				ms = append(ms, d)
				listed[d.Digest] = true
			}
		}
		// The tags moved leave their old descriptors, in one pass.
		ms = slices.DeleteFunc(ms, func(d ocispec.Descriptor) bool {
			_, moved := last[d.Annotations[ocispec.AnnotationRefName]]
			return moved
		})
		untagged := map[digest.Digest]int{} // position of a manifest listed untagged
		for i, d := range ms {
			if d.Annotations[ocispec.AnnotationRefName] == "" {
				if _, ok := untagged[d.Digest]; !ok {
					untagged[d.Digest] = i
				}
			}
		}
		for i, r := range tags {
			if err := ctx.Err(); err != nil {
				return false, err
			}
			if last[r.Tag] != i {
				continue
			}
			d := r.Desc
			if r.Tag != d.Digest.String() {
				ann := make(map[string]string, len(d.Annotations)+1)
				for k, v := range withoutRefName(d.Annotations) {
					ann[k] = v
				}
				ann[ocispec.AnnotationRefName] = r.Tag
				d.Annotations = ann
			}
			// A manifest listed untagged is listed once, tagged.
			j, ok := untagged[d.Digest]
			switch {
			case ok && r.Tag == d.Digest.String():
			case ok:
				ms[j] = d
				delete(untagged, d.Digest)
			default:
				ms = append(ms, d)
			}
		}
		x.doc.Manifests = ms
		x.index()
		return true, nil
	})
}

// Store stores a blob, verifying its size and digest, without listing a
// manifest in index.json (Update lists it).
func (s *layoutStore) Store(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	if desc.Size < 0 || IsManifest(desc.MediaType) && desc.Size > MaxManifestBytes {
		return fmt.Errorf("%s: push %s: size %d: %w", s.root, desc.Digest, desc.Size, errdef.ErrSizeExceedsLimit)
	}
	ok, err := s.Exists(ctx, desc)
	if err != nil || ok {
		return err
	}
	return s.ingest(desc, r)
}

// Untag removes the tag ref; the manifest stays listed, untagged.
func (s *layoutStore) Untag(ctx context.Context, ref string) error {
	if ref == "" {
		return errdef.ErrMissingReference
	}
	if _, err := digest.Parse(ref); err == nil {
		return fmt.Errorf("reference %q is a digest and not a tag: %w", ref, errdef.ErrInvalidReference)
	}
	return s.write(ctx, func(x *layoutIndex) (bool, error) {
		i := slices.IndexFunc(x.doc.Manifests, func(d ocispec.Descriptor) bool {
			return d.Annotations[ocispec.AnnotationRefName] == ref
		})
		if i < 0 {
			return false, fmt.Errorf("%s: tag %s: %w", s.root, ref, errdef.ErrNotFound)
		}
		d := x.doc.Manifests[i]
		ms := slices.DeleteFunc(x.doc.Manifests, func(e ocispec.Descriptor) bool {
			return e.Annotations[ocispec.AnnotationRefName] == ref
		})
		if !slices.ContainsFunc(ms, func(e ocispec.Descriptor) bool { return e.Digest == d.Digest }) {
			d.Annotations = withoutRefName(d.Annotations)
			ms = slices.Insert(ms, min(i, len(ms)), d)
		}
		x.doc.Manifests = ms
		x.index()
		return true, nil
	})
}

// Delete removes a blob or a manifest and its tags.
func (s *layoutStore) Delete(ctx context.Context, desc ocispec.Descriptor) error {
	p, err := s.blobPath(desc.Digest)
	if err != nil {
		return err
	}
	err = s.write(ctx, func(x *layoutIndex) (bool, error) {
		n := len(x.doc.Manifests)
		x.doc.Manifests = slices.DeleteFunc(x.doc.Manifests, func(d ocispec.Descriptor) bool { return d.Digest == desc.Digest })
		x.index()
		return len(x.doc.Manifests) != n, nil
	})
	if err != nil {
		return err
	}
	dfd, err := s.blobDir(desc.Digest, false)
	if err == nil {
		err = unix.Unlinkat(dfd, desc.Digest.Encoded(), 0)
		unix.Close(dfd)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			err = &os.PathError{Op: "remove", Path: p, Err: err}
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %s: %w", s.root, desc.Digest, errdef.ErrNotFound)
	}
	return err
}

// Tags lists the tags in order, the unusable ones too (resolving one
// names what is wrong with it), as a registry lists every tag it has.
func (s *layoutStore) Tags(ctx context.Context, last string, fn func([]string) error) error {
	x, err := s.read(ctx)
	if err != nil {
		return err
	}
	var tags []string
	for t := range x.tags {
		if last == "" || t > last {
			tags = append(tags, t)
		}
	}
	for t := range x.bad {
		if last == "" || t > last {
			tags = append(tags, t)
		}
	}
	slices.Sort(tags)
	return fn(tags)
}

// successors are the descriptors a manifest or index points at.
type successors struct {
	MediaType string               `json:"mediaType"`
	Config    *ocispec.Descriptor  `json:"config"`
	Layers    []ocispec.Descriptor `json:"layers"`
	Manifests []ocispec.Descriptor `json:"manifests"`
	Subject   *ocispec.Descriptor  `json:"subject"`
}

// references reports whether one of the descriptors of m names d.
func (m *successors) references(d digest.Digest) bool {
	is := func(e ocispec.Descriptor) bool { return e.Digest == d }
	return slices.ContainsFunc(m.Layers, is) || slices.ContainsFunc(m.Manifests, is) ||
		(m.Config != nil && is(*m.Config)) || (m.Subject != nil && is(*m.Subject))
}

func (m *successors) all() []ocispec.Descriptor {
	out := append(append([]ocispec.Descriptor(nil), m.Layers...), m.Manifests...)
	if m.Config != nil {
		out = append(out, *m.Config)
	}
	if m.Subject != nil {
		out = append(out, *m.Subject)
	}
	return out
}

// Predecessors returns the manifests listed in index.json that reference
// node. It reads those manifests one at a time, each at most
// MaxManifestBytes: no graph is kept.
func (s *layoutStore) Predecessors(ctx context.Context, node ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	var out []ocispec.Descriptor
	err := s.eachManifest(ctx, func(d ocispec.Descriptor, b []byte) {
		// Without an escape, a manifest names node only if it holds its
		// digest as it is: the others (the part manifests of a large
		// version, 20,000 layers each) are not decoded.
		if !bytes.Contains(b, []byte(node.Digest)) && bytes.IndexByte(b, '\\') < 0 {
			return
		}
		var m successors
		if json.Unmarshal(b, &m) == nil && m.references(node.Digest) {
			out = append(out, d)
		}
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b ocispec.Descriptor) int { return cmp.Compare(a.Digest, b.Digest) })
	return out, nil
}

// eachManifest calls fn with every manifest listed in index.json and its
// bytes (at most MaxManifestBytes), one at a time; a manifest gone from the
// blobs is passed over.
func (s *layoutStore) eachManifest(ctx context.Context, fn func(d ocispec.Descriptor, b []byte)) error {
	x, err := s.read(ctx)
	if err != nil {
		return err
	}
	for _, d := range x.digests {
		if err := ctx.Err(); err != nil {
			return err
		}
		b, err := s.fetchManifest(d)
		if errors.Is(err, errdef.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		fn(d, b)
	}
	return nil
}

// ReferrersBySubject returns the referrers of every manifest listed in
// index.json, by subject (each list sorted by digest, with the artifactType
// and annotations Referrers gives): each manifest is read once, where
// Referrers reads them all for every subject asked about.
func (s *layoutStore) ReferrersBySubject(ctx context.Context) (map[digest.Digest][]ocispec.Descriptor, error) {
	out := map[digest.Digest][]ocispec.Descriptor{}
	err := s.eachManifest(ctx, func(d ocispec.Descriptor, b []byte) {
		if !bytes.Contains(b, []byte(`"subject"`)) && bytes.IndexByte(b, '\\') < 0 {
			return // the part manifests of a large version are not decoded
		}
		var m struct {
			ArtifactType string              `json:"artifactType"`
			Config       *ocispec.Descriptor `json:"config"`
			Subject      *ocispec.Descriptor `json:"subject"`
			Annotations  map[string]string   `json:"annotations"`
		}
		if json.Unmarshal(b, &m) != nil || m.Subject == nil {
			return
		}
		at := m.ArtifactType
		if at == "" && m.Config != nil {
			at = m.Config.MediaType
		}
		out[m.Subject.Digest] = append(out[m.Subject.Digest], ocispec.Descriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size,
			ArtifactType: at, Annotations: m.Annotations})
	})
	if err != nil {
		return nil, err
	}
	for k, ds := range out {
		out[k] = sortDescs(ds)
	}
	return out, nil
}

// LayoutReachable returns the digests of the blobs that the manifests
// listed in index.json of the OCI layout at dir reach through descriptors
// (config, layers, manifests, subject), those manifests included. Each
// manifest is read once, at most MaxManifestBytes; a manifest that is
// listed but missing is skipped. A manifest that cannot be read is an
// error: what it reaches is unknown.
func LayoutReachable(ctx context.Context, dir string) (map[digest.Digest]bool, error) {
	s := &layoutStore{root: dir}
	b, _, err := s.readSmall(ocispec.ImageIndexFile, MaxLayoutIndexBytes)
	if err != nil {
		return nil, err
	}
	x, err := parseIndex(dir, b)
	if err != nil {
		return nil, err
	}
	reach := map[digest.Digest]bool{}
	var stack []ocispec.Descriptor
	for _, d := range x.doc.Manifests {
		if err := d.Digest.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %s: %w: descriptor %q", dir, ocispec.ImageIndexFile, ErrInvalidLayout, d.Digest)
		}
		stack = append(stack, d)
	}
	for len(stack) > 0 {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if reach[d.Digest] || d.Digest.Validate() != nil {
			continue
		}
		reach[d.Digest] = true
		if !IsManifest(d.MediaType) {
			continue
		}
		b, err := s.fetchManifest(d)
		if errors.Is(err, errdef.ErrNotFound) {
			continue // a dangling reference: nothing to follow
		}
		if err != nil {
			return nil, err
		}
		var m successors
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%s: manifest %s: %w: %v", dir, d.Digest, ErrInvalidLayout, err)
		}
		stack = append(stack, m.all()...)
	}
	return reach, nil
}
