package source

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/semaphore"

	"github.com/bdnvol/bdnvol/internal/pathglob"
	"github.com/bdnvol/bdnvol/internal/termsafe"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/modelpack"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// ociScheme prefixes a registry source; a source that starts with
// oci.LayoutPrefix but not with it is an OCI layout.
const ociScheme = "oci://"

// isOCI reports whether uri names an OCI source: oci://HOST/REPO… or
// oci:PATH….
func isOCI(uri string) bool { return strings.HasPrefix(uri, oci.LayoutPrefix) }

// parseOCI parses an OCI source: oci://HOST/REPO[:TAG][@DIGEST] or
// oci:PATH[:TAG][@DIGEST]; it must name a tag or a digest.
func parseOCI(uri string) (oci.Ref, error) {
	s := uri
	if rest, ok := strings.CutPrefix(uri, ociScheme); ok {
		s = rest
	}
	r, err := oci.ParseRef(s)
	if err != nil {
		return r, fmt.Errorf("%w %q: %v", ErrUnsupported, uri, err)
	}
	if r.Reference() == "" {
		return r, fmt.Errorf("%w %q: name a tag or a digest (oci://HOST/REPO:TAG or @sha256:…)", ErrUnsupported, uri)
	}
	return r, nil
}

// ociName is the source's name for a reference: oci://HOST/REPO… for a
// registry, oci:PATH… for a layout.
func ociName(r oci.Ref) string {
	if r.Layout != "" {
		return r.String()
	}
	return ociScheme + r.String()
}

// Pin returns uri with what it names now pinned where the source can be:
// an oci:// source's tag resolved to its manifest digest
// (oci://HOST/REPO:TAG@sha256:…), so that a job imports that manifest
// however often it is run. Other sources are returned as they are (a Hub
// revision is resolved each time the job lists it).
func Pin(ctx context.Context, uri string, opt Options) (string, error) {
	if !isOCI(uri) {
		return uri, nil
	}
	r, err := parseOCI(uri)
	if err != nil {
		return "", err
	}
	t, err := oci.Open(ctx, r, ociOptions(opt))
	if err != nil {
		return "", err
	}
	desc, _, err := oci.FetchManifest(ctx, t, r, layout.MaxManifestBytes)
	if err != nil {
		return "", err
	}
	r.Digest = desc.Digest
	return ociName(r), nil
}

func ociOptions(opt Options) oci.Options {
	o := opt.OCI
	o.UserAgent = opt.UserAgent
	if opt.Limiter != nil {
		o.Limiter = opt.Limiter
	}
	o.CreateLayout = false
	return o
}

// ociSource is a ModelPack artifact (or an OCI image manifest whose layers
// are files or tars of files) read from a registry or an OCI layout.
//
// Every layer is verified against its digest by hashing its bytes in order
// as the push reads them (ociLayer): a raw layer is one file; the files of
// an uncompressed tar are read by range at the offsets its headers give
// (read by range at the walk, and the bytes between files kept so that
// the hash runs on from one file to the next); a compressed tar is
// streamed and decompressed once, whole, at the walk, verified, each of
// its files' SHA-256 recorded and the bytes of the files the push will
// read kept (in memory for a small layer, else in the spool file), so the
// push reads them without decompressing the layer again.
type ociSource struct {
	ref    oci.Ref
	opt    Options
	filter *pathglob.Filter
	t      oci.Target
	reqs   *semaphore.Weighted
	buffer *semaphore.Weighted

	mu     sync.Mutex
	desc   ocispec.Descriptor // the manifest, once walked
	layers []*ociLayer
	files  map[string]*ociFile
	spool  *spool // the walk's, or nil
}

var _ Source = (*ociSource)(nil)

// ociFile is one regular file of a layer.
type ociFile struct {
	path  string
	layer *ociLayer
	off   int64 // of its first byte in the layer's (uncompressed) content
	size  int64
	mode  uint32
	// sum is its SHA-256 when known before it is read: a raw layer's
	// digest, or what the walk of a compressed tar computed.
	sum digest.Digest
	// inOrder is its SHA-256 as the layer's in-order hash saw it.
	inOrder digest.Digest
	// data is its bytes, for a file of a small tar layer the walk read
	// whole and verified; nil otherwise.
	data []byte
	// spooled tells that the walk wrote its bytes (of a compressed layer)
	// to the spool file, at spoolOff.
	spooled  bool
	spoolOff int64
}

// spool is an unlinked temporary file (in TMPDIR) holding the bytes of
// the files of compressed tar layers that the push reads and the walk
// cannot keep in memory: the walk writes them as it decompresses each
// layer, once, and the push reads them back by offset. It is created at
// the first such file; its space is freed when it is closed (Close) or
// the process ends.
type spool struct {
	f   *os.File
	at  int64 // bytes written
	err error // the first write's error
}

// Write appends b to the spool, creating its file first if need be.
func (sp *spool) Write(b []byte) (int, error) {
	if sp.err != nil {
		return 0, sp.err
	}
	if sp.f == nil {
		f, err := os.CreateTemp("", "bdnvol-sync-*")
		if err != nil {
			sp.err = err
			return 0, err
		}
		os.Remove(f.Name()) // unlinked: nothing is left behind
		sp.f = f
	}
	n, err := sp.f.Write(b)
	sp.at += int64(n)
	if err != nil {
		sp.err = err
	}
	return n, err
}

// spoolError says that the bytes of the file p could not be spooled.
func spoolError(p string, err error) error {
	return fmt.Errorf("%s: keep its bytes for the push in a temporary file (TMPDIR %s): %w", termsafe.Short(p), os.TempDir(), err)
}

func (sp *spool) close() {
	if sp != nil && sp.f != nil {
		sp.f.Close()
	}
}

// Close frees what a walk of s kept for its push (the spool file of an
// OCI source's compressed layers); s is not to be read after it.
func Close(s Source) error {
	if o, ok := s.(*ociSource); ok {
		o.mu.Lock()
		sp := o.spool
		o.spool = nil
		o.mu.Unlock()
		sp.close()
	}
	return nil
}

// gap is bytes of an uncompressed tar outside every file (headers,
// padding), kept from the walk.
type gap struct {
	off  int64
	data []byte
}

// ociLayer is a layer and the in-order hash of its content.
type ociLayer struct {
	l     modelpack.Layer
	files []*ociFile // by offset
	gaps  []gap      // by offset

	mu  sync.Mutex
	h   hash.Hash
	at  int64 // bytes hashed so far
	cur int   // the file the frontier is in or before
	fh  hash.Hash
	gi  int   // next gap
	err error // the mismatch, once known
}

func newOCI(uri string, opt Options, f *pathglob.Filter) (*ociSource, error) {
	r, err := parseOCI(uri)
	if err != nil {
		return nil, err
	}
	return &ociSource{ref: r, opt: opt, filter: f,
		reqs: semaphore.NewWeighted(int64(opt.Concurrency)), buffer: semaphore.NewWeighted(opt.Buffer)}, nil
}

func (s *ociSource) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.ref
	if s.desc.Digest != "" {
		r.Digest = s.desc.Digest
	}
	return ociName(r)
}

// Remote reports true: layers are read over the network.
func (s *ociSource) Remote() bool { return true }

// Revision returns the digest of the manifest the walk read.
func (s *ociSource) Revision() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.desc.Digest.String()
}

// Identities returns none: a file's digest (raw layers) is its identity.
func (s *ociSource) Identities() Identities { return Identities{} }

// maxDiagnosed is the largest layer whose listing error is checked
// against its digest (by streaming it) before it is reported.
const maxDiagnosed = 1 << 30

// smallLayer is the largest tar layer (compressed or not) whose files the
// walk keeps in memory, read once, whole, and verified: a layer of many
// small files (code, configs) costs one request, not one per file.
// maxSmallBytes bounds what the walk keeps so, per source.
const (
	smallLayer    = 4 << 20
	maxSmallBytes = 64 << 20
)

// maxGapBytes bounds the tar bytes outside files the walk keeps, per
// source; past it the hash of a layer is completed by streaming it.
const maxGapBytes = 64 << 20

// Walk fetches the manifest (verified against the pinned digest), lists
// the files of every layer, and returns them with their directories.
func (s *ociSource) Walk(ctx context.Context) ([]push.Entry, error) {
	t, err := oci.Open(ctx, s.ref, ociOptions(s.opt))
	if err != nil {
		return nil, err
	}
	name := ociName(s.ref)
	desc, b, err := oci.FetchManifest(ctx, t, s.ref, layout.MaxManifestBytes)
	if err != nil {
		return nil, err
	}
	a, err := modelpack.Parse(desc, b)
	if err != nil {
		if bytes.Contains(b, []byte(`"application/vnd.bdnvol.`)) {
			return nil, fmt.Errorf("%s: %w: it is a bdnvol version, not a model: copy it with bdnvol copy", name, ErrUnsupported)
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var layers []*ociLayer
	files := map[string]*ociFile{}
	where := map[string]int{}
	dirs := map[string]bool{}
	gapBudget, memBudget := int64(maxGapBytes), int64(maxSmallBytes)
	sp := &spool{}
	kept := false // sp is handed to the source
	defer func() {
		if !kept {
			sp.close()
		}
	}()
	count := 0
	for i, l := range a.Layers {
		ol := &ociLayer{l: l, h: sha256.New(), fh: sha256.New()}
		switch {
		case l.Packing == modelpack.PackingRaw:
			ol.files = []*ociFile{{path: l.Path, layer: ol, size: l.Desc.Size, mode: l.Mode, sum: l.Desc.Digest}}
		case l.Packing.RangeReadable() && l.Desc.Size <= smallLayer && l.Desc.Size <= memBudget:
			memBudget -= l.Desc.Size
			err = s.listSmallTar(ctx, t, ol)
		case l.Packing.RangeReadable():
			err = s.listTar(ctx, t, ol, &gapBudget)
		default:
			err = s.listCompressed(ctx, t, ol, &memBudget, sp)
		}
		if err != nil && l.Desc.Size <= maxDiagnosed && !errors.Is(err, ErrDigestMismatch) && !errors.Is(err, verify.ErrDigestMismatch) && ctx.Err() == nil {
			// A tar that does not parse may be a layer damaged on its
			// way: say so when it does not match its digest.
			if verr := checkWhole(ctx, t, l.Desc); verr != nil {
				err = verr
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: layer %d (%s): %w", name, i, l.Desc.Digest, err)
		}
		for _, f := range ol.files {
			count++
			if count > modelpack.MaxFiles || count > layout.MaxEntries {
				return nil, fmt.Errorf("%s: %w: more than %d files", name, modelpack.ErrInvalid, min(modelpack.MaxFiles, layout.MaxEntries))
			}
			if j, dup := where[f.path]; dup {
				return nil, fmt.Errorf("%s: %w: %s is in layer %d and layer %d", name, modelpack.ErrInvalid, termsafe.Short(f.path), j, i)
			}
			where[f.path] = i
			if !s.filter.Match(f.path) {
				continue
			}
			files[f.path] = f
			for p := parent(f.path); p != ""; p = parent(p) {
				dirs[p] = true
			}
		}
		layers = append(layers, ol)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: %w", name, ErrEmpty)
	}
	out := make([]push.Entry, 0, len(files)+len(dirs))
	for d := range dirs {
		if _, clash := where[d]; clash {
			return nil, fmt.Errorf("%s: %w: %s is both a file and a directory", name, modelpack.ErrInvalid, termsafe.Short(d))
		}
		out = append(out, push.Entry{Path: d, Type: layout.TypeDir, Mode: 0o755})
	}
	for p, f := range files {
		out = append(out, push.Entry{Path: p, Type: layout.TypeFile, Mode: f.mode, Size: f.size, Stat: statcache.Key{Size: f.size}, Digest: f.sum})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	s.mu.Lock()
	old := s.spool
	s.t, s.desc, s.layers, s.files, s.spool = t, desc, layers, files, sp
	s.mu.Unlock()
	old.close()
	kept = true
	return out, nil
}

// checkWhole streams the blob desc and returns its mismatch, if any.
func checkWhole(ctx context.Context, t oci.Target, desc ocispec.Descriptor) error {
	rc, err := t.Fetch(ctx, desc)
	if err != nil {
		return nil
	}
	defer rc.Close()
	vr := verify.Reader(rc, "layer", desc)
	if _, err := io.Copy(io.Discard, vr); err != nil && errors.Is(err, verify.ErrDigestMismatch) {
		return err
	}
	return nil
}

// listTar reads the headers of an uncompressed tar layer by range, keeping
// the bytes outside its files (within budget) for the in-order hash.
func (s *ociSource) listTar(ctx context.Context, t oci.Target, ol *ociLayer, budget *int64) error {
	rs := &rangeSeeker{ctx: ctx, fetch: func(ctx context.Context, off, n int64) ([]byte, error) {
		return s.fetchRange(ctx, t, ol.l.Desc, off, n)
	}, size: ol.l.Desc.Size}
	if err := listTarFrom(rs, ol); err != nil {
		return err
	}
	s.keepGaps(ctx, t, ol, rs, budget)
	return nil
}

// listTarFrom lists the regular files of the tar read through rs into
// ol.files, at the offsets of their bytes.
func listTarFrom(rs *rangeSeeker, ol *ociLayer) error {
	tr := tar.NewReader(rs)
	for {
		h, p, err := modelpack.NextFile(tr)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if rs.err != nil {
				return rs.err
			}
			return err
		}
		if h.Size > ol.l.Desc.Size-rs.pos {
			return fmt.Errorf("%w: %s claims %d bytes, past the end of its layer", modelpack.ErrInvalid, termsafe.Short(p), h.Size)
		}
		ol.files = append(ol.files, &ociFile{path: p, layer: ol, off: rs.pos, size: h.Size, mode: modelpack.TarMode(h)})
		if len(ol.files) > modelpack.MaxFiles {
			return fmt.Errorf("%w: more than %d files", modelpack.ErrInvalid, modelpack.MaxFiles)
		}
	}
}

// keepGaps is the rest of listTar: the end of the archive read, and the
// bytes outside files kept for the in-order hash.
func (s *ociSource) keepGaps(ctx context.Context, t oci.Target, ol *ociLayer, rs *rangeSeeker, budget *int64) {
	// The end of the archive: blocks of zeros, padding to a record.
	if rest := ol.l.Desc.Size - rs.pos; rest > 0 && rest <= 1<<20 {
		if b, err := s.fetchRange(ctx, t, ol.l.Desc, rs.pos, rest); err == nil {
			rs.seen = append(rs.seen, gap{rs.pos, b})
		}
	}
	// Keep what the reads saw outside the files' bytes.
	fi := 0
	for _, g := range rs.seen {
		for len(g.data) > 0 {
			for fi < len(ol.files) && ol.files[fi].off+ol.files[fi].size <= g.off {
				fi++
			}
			end := g.off + int64(len(g.data))
			if fi < len(ol.files) && ol.files[fi].off < end {
				f := ol.files[fi]
				if f.off > g.off {
					keep := gap{g.off, g.data[:f.off-g.off]}
					if int64(len(keep.data)) <= *budget {
						*budget -= int64(len(keep.data))
						ol.gaps = append(ol.gaps, keep)
					}
				}
				skip := min(end, f.off+f.size) - g.off
				g = gap{g.off + skip, g.data[skip:]}
				continue
			}
			if int64(len(g.data)) <= *budget {
				*budget -= int64(len(g.data))
				ol.gaps = append(ol.gaps, g)
			}
			break
		}
	}
}

// listSmallTar reads a small uncompressed tar layer whole, verifies it
// against its digest, lists it and keeps its files' bytes.
func (s *ociSource) listSmallTar(ctx context.Context, t oci.Target, ol *ociLayer) error {
	b, err := s.fetchRange(ctx, t, ol.l.Desc, 0, ol.l.Desc.Size)
	if err != nil {
		return err
	}
	if got := digest.FromBytes(b); got != ol.l.Desc.Digest {
		return fmt.Errorf("layer %s: %w: got %s", ol.l.Desc.Digest, ErrDigestMismatch, got)
	}
	fetch := func(_ context.Context, off, n int64) ([]byte, error) { return b[off : off+n], nil }
	rs := &rangeSeeker{ctx: ctx, fetch: fetch, size: int64(len(b))}
	if err := listTarFrom(rs, ol); err != nil {
		return err
	}
	for _, f := range ol.files {
		f.data = b[f.off : f.off+f.size]
		f.sum = digest.FromBytes(f.data)
	}
	ol.at = ol.l.Desc.Size // verified whole
	return nil
}

// listCompressed streams a compressed tar layer whole, verified against
// its digest, and records the offset and SHA-256 of each of its files and
// keeps the bytes of those the filter selects: for a small layer and
// while budget lasts in memory, else in sp.
func (s *ociSource) listCompressed(ctx context.Context, t oci.Target, ol *ociLayer, budget *int64, sp *spool) error {
	rc, err := t.Fetch(ctx, ol.l.Desc)
	if err != nil {
		return err
	}
	defer rc.Close()
	vr := verify.Reader(rc, "layer", ol.l.Desc)
	r, closeFn, err := modelpack.Decompress(ol.l, vr)
	if err != nil {
		return err
	}
	defer closeFn()
	cr := &countReader{r: r}
	tr := tar.NewReader(cr)
	keep := ol.l.Desc.Size <= smallLayer
	var held int64
	for {
		h, p, err := modelpack.NextFile(tr)
		if err == io.EOF {
			break
		}
		if err != nil {
			return err // a digest mismatch of the layer's bytes stays one (errors.Is)
		}
		f := &ociFile{path: p, layer: ol, off: cr.n, size: h.Size, mode: modelpack.TarMode(h)}
		hh := sha256.New()
		var w io.Writer = hh
		var kept bytes.Buffer
		selected := s.filter.Match(p)
		switch {
		case keep && h.Size <= *budget-held:
			w = io.MultiWriter(hh, &kept)
		case selected:
			keep = false
			f.spooled, f.spoolOff = true, sp.at
			w = io.MultiWriter(hh, sp)
		default:
			keep = false
		}
		if n, err := io.Copy(w, tr); err != nil || n != h.Size {
			if sp.err != nil {
				return spoolError(p, sp.err)
			}
			return fmt.Errorf("%s: read %d of %d bytes: %v", termsafe.Short(p), n, h.Size, err)
		}
		f.sum = digest.NewDigest(digest.SHA256, hh)
		if keep {
			f.data = kept.Bytes()
			held += h.Size
		}
		ol.files = append(ol.files, f)
		if len(ol.files) > modelpack.MaxFiles {
			return fmt.Errorf("%w: more than %d files", modelpack.ErrInvalid, modelpack.MaxFiles)
		}
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, vr); err != nil {
		return err
	}
	if !vr.Verified() {
		return fmt.Errorf("%w: layer not read to its end", modelpack.ErrInvalid)
	}
	if !keep {
		// The layer's files are not all kept in memory: those that were
		// go to the spool too.
		for _, f := range ol.files {
			if f.data != nil && s.filter.Match(f.path) {
				f.spooled, f.spoolOff = true, sp.at
				if _, err := sp.Write(f.data); err != nil {
					return spoolError(f.path, err)
				}
			}
			f.data = nil
		}
		held = 0
	}
	*budget -= held
	return nil
}

// fetchRange reads n bytes at off of a blob: one range request, or where
// the registry serves no ranges, the blob streamed from its start.
func (s *ociSource) fetchRange(ctx context.Context, t oci.Target, desc ocispec.Descriptor, off, n int64) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	var rc io.ReadCloser
	var err error
	skip := int64(0)
	if rf, ok := t.(oci.RangeFetcher); ok {
		rc, err = rf.FetchRange(ctx, desc, off, n)
	}
	if rc == nil && (err == nil || errors.Is(err, oci.ErrRangeUnsupported)) {
		rc, err = t.Fetch(ctx, desc)
		skip = off
	}
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if skip > 0 {
		if _, err := io.CopyN(io.Discard, rc, skip); err != nil {
			return nil, fmt.Errorf("blob %s: skip to %d: %w", desc.Digest, off, err)
		}
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(rc, buf); err != nil {
		return nil, fmt.Errorf("blob %s: read %d bytes at %d: %w", desc.Digest, n, off, err)
	}
	return buf, nil
}

// Open returns a reader of the file at p. Its reads feed its layer's
// in-order hash; the read that completes a layer whose bytes do not hash
// to its digest fails.
func (s *ociSource) Open(ctx context.Context, p string) (push.ReadAtCloser, error) {
	s.mu.Lock()
	f, t, sp := s.files[p], s.t, s.spool
	s.mu.Unlock()
	if f == nil {
		return nil, fmt.Errorf("%s: %s: %w (not listed by the walk)", s, p, ErrNotFound)
	}
	desc := f.layer.l.Desc
	if f.data != nil {
		return memFile{bytes.NewReader(f.data)}, nil // verified with its layer
	}
	if !f.layer.l.Packing.RangeReadable() {
		if f.size == 0 {
			return memFile{bytes.NewReader(nil)}, nil // nothing was spooled
		}
		if !f.spooled || sp == nil || sp.f == nil {
			return nil, fmt.Errorf("%s: %s: the walk kept no bytes of it", s, p)
		}
		r := spoolFile{io.NewSectionReader(sp.f, f.spoolOff, f.size)}
		return newVerifier(r, f.size, expectSHA256(f.sum.Encoded()), s.String(), p), nil
	}
	ctx, cancel := context.WithCancel(ctx)
	br := &blockReader{
		ctx: ctx, cancel: cancel, size: f.size, bs: s.opt.BlockSize, ahead: s.opt.Readahead,
		reqs: s.reqs, buffer: s.buffer, blocks: map[int64]*block{},
		fetch: func(ctx context.Context, off, n int64) ([]byte, error) {
			return s.fetchRange(ctx, t, desc, f.off+off, n)
		},
		name: fmt.Sprintf("%s: %s", s, p),
	}
	return &layerFileReader{blockReader: br, f: f, name: s.String()}, nil
}

// spoolFile is a file of a compressed layer the walk kept in the spool.
type spoolFile struct{ *io.SectionReader }

func (spoolFile) Close() error { return nil }

// memFile is a file the walk holds in memory.
type memFile struct{ *bytes.Reader }

func (memFile) Close() error { return nil }

// layerFileReader reads a file of a range-readable layer, feeding the
// layer's in-order hash.
type layerFileReader struct {
	*blockReader
	f    *ociFile
	name string
}

func (r *layerFileReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := r.blockReader.ReadAt(p, off)
	if n > 0 {
		if herr := r.f.layer.feed(r.f.off+off, p[:n]); herr != nil {
			return 0, fmt.Errorf("%s: %s: %w", r.name, r.f.path, herr)
		}
	}
	return n, err
}

// feed hashes b, the bytes at off of the layer, where they continue what
// was hashed (and the kept gaps after them); once the whole layer is
// hashed it returns the mismatch, if any.
func (l *ociLayer) feed(off int64, b []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if l.at == l.l.Desc.Size {
		return nil
	}
	if off <= l.at && off+int64(len(b)) > l.at {
		l.consume(b[l.at-off:])
	}
	for l.gi < len(l.gaps) && l.gaps[l.gi].off <= l.at {
		g := l.gaps[l.gi]
		if end := g.off + int64(len(g.data)); end > l.at {
			l.consume(g.data[l.at-g.off:])
		}
		l.gi++
	}
	l.closeEmpty()
	if l.at == l.l.Desc.Size {
		if got := digest.NewDigest(digest.SHA256, l.h); got != l.l.Desc.Digest {
			l.err = fmt.Errorf("layer %s: %w: got %s", l.l.Desc.Digest, ErrDigestMismatch, got)
			return l.err
		}
	}
	return nil
}

// consume hashes b at the frontier: into the layer's hash, and into the
// hash of the file it belongs to, closing each file it ends.
func (l *ociLayer) consume(b []byte) {
	for len(b) > 0 {
		l.closeEmpty()
		n := int64(len(b))
		var f *ociFile
		if l.cur < len(l.files) {
			f = l.files[l.cur]
			if l.at >= f.off {
				n = min(n, f.off+f.size-l.at)
			} else {
				n = min(n, f.off-l.at)
				f = nil
			}
		}
		l.h.Write(b[:n])
		if f != nil {
			l.fh.Write(b[:n])
		}
		l.at += n
		b = b[n:]
		if f != nil && l.at == f.off+f.size {
			f.inOrder = digest.NewDigest(digest.SHA256, l.fh)
			l.fh.Reset()
			l.cur++
		}
	}
}

// closeEmpty records the digest of empty files the frontier has reached.
func (l *ociLayer) closeEmpty() {
	for l.cur < len(l.files) && l.files[l.cur].size == 0 && l.files[l.cur].off <= l.at {
		l.files[l.cur].inOrder = digest.FromBytes(nil)
		l.cur++
	}
}

// finish hashes the rest of the layer from the frontier, streamed from
// the source, and returns the mismatch if the layer does not match its
// digest.
func (s *ociSource) finish(ctx context.Context, l *ociLayer) error {
	l.mu.Lock()
	at, err := l.at, l.err
	l.mu.Unlock()
	if err != nil || at == l.l.Desc.Size {
		return l.feed(at, nil)
	}
	const step = 8 << 20
	for at < l.l.Desc.Size {
		n := min(step, l.l.Desc.Size-at)
		b, err := s.fetchRange(ctx, s.t, l.l.Desc, at, n)
		if err != nil {
			return err
		}
		if err := l.feed(at, b); err != nil {
			return err
		}
		at += n
	}
	return l.feed(at, nil)
}

// verifyIndex checks the pushed index x against the layers: each layer
// whose files the push read by range is hashed to its end (streaming what
// the push did not read in order) and must match its digest, and every
// file's digest in x must be the SHA-256 of its bytes in the layer.
func (s *ociSource) verifyIndex(ctx context.Context, x *layout.Index) error {
	s.mu.Lock()
	layers, files := s.layers, s.files
	s.mu.Unlock()
	for _, l := range layers {
		if l.l.Packing != modelpack.PackingTar {
			continue
		}
		used := false
		for _, f := range l.files {
			if files[f.path] == f {
				used = true
			}
		}
		if !used {
			continue
		}
		if err := s.finish(ctx, l); err != nil {
			return fmt.Errorf("%s: layer %s: %w", s, l.l.Desc.Digest, err)
		}
	}
	var bad []string
	for fi := range x.Len() {
		xf := x.File(fi)
		f := files[xf.Path]
		if xf.Type != layout.TypeFile || f == nil {
			continue
		}
		want := f.sum
		if want == "" {
			want = f.inOrder
		}
		if xf.Digest != want {
			bad = append(bad, fmt.Sprintf("%s (want %s, got %s)", xf.Path, want, xf.Digest))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s: %w: %s", s, ErrDigestMismatch, strings.Join(bad, ", "))
	}
	return nil
}

// rangeSeeker is an io.ReadSeeker over a blob read by range in small
// blocks, for reading tar headers without the files between them; it
// keeps every run of bytes it read.
type rangeSeeker struct {
	ctx   context.Context // of the walk that reads through it
	fetch func(ctx context.Context, off, n int64) ([]byte, error)
	size  int64
	pos   int64
	buf   []byte // the bytes at bufAt
	bufAt int64
	seen  []gap
	err   error
}

const headerBlock = 64 << 10

func (r *rangeSeeker) Read(p []byte) (int, error) {
	if r.pos >= r.size {
		return 0, io.EOF
	}
	if r.pos < r.bufAt || r.pos >= r.bufAt+int64(len(r.buf)) {
		n := min(int64(headerBlock), r.size-r.pos)
		b, err := r.fetch(r.ctx, r.pos, n)
		if err != nil {
			r.err = err
			return 0, err
		}
		r.buf, r.bufAt = b, r.pos
	}
	n := copy(p, r.buf[r.pos-r.bufAt:])
	r.record(r.pos, p[:n])
	r.pos += int64(n)
	return n, nil
}

// record keeps b, read at off, appending to the last run when it follows it.
func (r *rangeSeeker) record(off int64, b []byte) {
	if k := len(r.seen) - 1; k >= 0 && r.seen[k].off+int64(len(r.seen[k].data)) == off {
		r.seen[k].data = append(r.seen[k].data, b...)
		return
	}
	r.seen = append(r.seen, gap{off, append([]byte(nil), b...)})
}

func (r *rangeSeeker) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		off += r.pos
	case io.SeekEnd:
		off += r.size
	}
	if off < 0 {
		return 0, errors.New("negative position")
	}
	r.pos = off
	return off, nil
}

// countReader counts the bytes read through it.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
