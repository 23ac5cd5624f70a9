package layout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// ErrNotVolume is wrapped when a manifest is not a bdnvol volume.
var ErrNotVolume = errors.New("not a bdnvol volume")

// maxParts bounds the part manifests of one version (each holds up to
// DefaultMaxLayers chunks: far beyond a petabyte).
const maxParts = 20000

// maxManifestLayers bounds the layers of one manifest: a 4 MiB manifest of
// chunk descriptors holds about 35,000.
const maxManifestLayers = 1 << 16

// Version is a sealed version opened for reading: its root and its
// validated index, whose chunks it names as blobs with Chunk. (A version
// as a listing reports it, with its tags, is a versions.Version.)
type Version struct {
	Root  ocispec.Descriptor
	Index *Index
	// Meta are its manifests and metadata blobs: the root, the part
	// manifests, their configs and the file index.
	Meta []ocispec.Descriptor
	// Foreign is the artifactType of a foreign artifact opened as a version
	// (see OpenOptions.Foreign), "" for a bdnvol volume.
	Foreign string
	// Chunks, set for a foreign artifact, returns the fetcher of its chunks
	// given the repository's fetcher; read it through ChunkSource.
	Chunks func(src content.Fetcher) content.Fetcher
	// Streamed, for a foreign artifact, are the paths of files that cannot
	// be read by range: a read of any of their chunks streams a layer.
	Streamed map[string]bool
}

// OpenOptions configure OpenWith. The zero value opens a version as Open
// does.
type OpenOptions struct {
	// SkipEdges leaves the chunks' edge digests out of the opened index
	// (they are checked all the same): Chunk reports no edges, so a reader
	// of the version fetches whole chunks. For readers that never fetch an
	// edge (inspect, diff); it saves 64 of the 104 bytes a chunk takes.
	SkipEdges bool
	// Foreign are the other formats read as versions (a ModelPack model:
	// modelpack.Format); a manifest of any other is refused with
	// ErrNotVolume.
	Foreign []ForeignFormat
}

// Open fetches and validates the manifests and file index of the bdnvol
// version whose root is desc (OpenWith also reads other formats). Every byte fetched is verified against its digest.
// Manifests are read one at a time and checked against the file index as
// they come, so memory stays bounded by the index, whatever they list.
func Open(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) (*Version, error) {
	return OpenWith(ctx, src, desc, OpenOptions{})
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor, opt OpenOptions) (*Version, error) {
	root, err := fetchManifest(ctx, src, desc, maxParts)
	if err != nil {
		return nil, err
	}
	if open, ok := foreignOpener(opt.Foreign, root.ArtifactType, root.Config.MediaType); ok && root.MediaType == ocispec.MediaTypeImageManifest {
		return open(ctx, src, desc)
	}
	if root.ArtifactType != ArtifactTypeVolume && (root.MediaType == ocispec.MediaTypeImageManifest || root.MediaType == ocispec.MediaTypeImageIndex) {
		return nil, fmt.Errorf("%s: artifactType %q: %w", desc.Digest, root.ArtifactType, ErrNotVolume)
	}
	v := &Version{Root: desc, Meta: []ocispec.Descriptor{desc}}
	parts, first, err := v.firstPart(ctx, src, root)
	if err != nil {
		return nil, err
	}
	if first.Config.Digest != "" {
		v.Meta = append(v.Meta, first.Config)
	}
	// The pieces of a version 2 index are fetched while the top-level
	// index is: the manifest lists them, so no round trip waits on another.
	ahead := startPieces(ctx, src, first)
	defer ahead.stop()
	m := &layerCheck{src: src, v: v, ahead: ahead}
	if m.x, m.rd, err = v.readIndex(ctx, src, first, opt.SkipEdges); err != nil {
		return nil, err
	}
	// The layers after the index are the pieces (version 2), in the order
	// the top-level index lists them, then the chunks in index order. Each
	// piece is read when its layer comes, so every piece is known before the
	// first chunk layer is checked.
	match := func(l layer) error { return m.match(ctx, l) }
	err = first.eachLayer(func(l layer) error {
		if l.i == 0 {
			return nil // the file index, read above
		}
		return match(l)
	})
	if err != nil {
		return nil, err
	}
	for _, pd := range parts[min(1, len(parts)):] {
		part, err := fetchPart(ctx, src, desc, pd)
		if err != nil {
			return nil, err
		}
		v.Meta = append(v.Meta, pd)
		if part.Config.Digest != "" {
			v.Meta = append(v.Meta, part.Config)
		}
		if err := part.eachLayer(match); err != nil {
			return nil, err
		}
	}
	if err := m.finish(opt.SkipEdges); err != nil {
		return nil, err
	}
	return v, nil
}

// firstPart checks the root's form and returns its part manifests (none
// for a single manifest) and the manifest that starts with the file index:
// the root itself, or its first part, fetched.
func (v *Version) firstPart(ctx context.Context, src content.Fetcher, root *manifestOrIndex) ([]ocispec.Descriptor, *manifestOrIndex, error) {
	desc := v.Root
	switch root.MediaType {
	case ocispec.MediaTypeImageManifest:
		if len(root.Manifests) > 0 {
			return nil, nil, fmt.Errorf("%s: %w: a manifest that lists manifests", desc.Digest, ErrInvalidIndex)
		}
		return nil, root, nil
	case ocispec.MediaTypeImageIndex:
		if root.NumLayers > 0 || len(root.Manifests) == 0 {
			return nil, nil, fmt.Errorf("%s: %w: %d part manifests", desc.Digest, ErrInvalidIndex, len(root.Manifests))
		}
		parts := root.Manifests
		seen := make(map[digest.Digest]bool, len(parts))
		for _, pd := range parts {
			if seen[pd.Digest] {
				return nil, nil, fmt.Errorf("part %s of %s: %w: listed twice", pd.Digest, desc.Digest, ErrInvalidIndex)
			}
			seen[pd.Digest] = true
		}
		first, err := fetchPart(ctx, src, desc, parts[0])
		if err != nil {
			return nil, nil, err
		}
		v.Meta = append(v.Meta, parts[0])
		return parts, first, nil
	}
	return nil, nil, fmt.Errorf("%s: media type %q: %w", desc.Digest, root.MediaType, ErrNotVolume)
}

// readIndex fetches and decodes the file index, the first layer of first:
// a whole index (version 1), or the top-level index of a version 2 one,
// with the reader its pieces are added to.
func (v *Version) readIndex(ctx context.Context, src content.Fetcher, first *manifestOrIndex, skipEdges bool) (*Index, *v2Reader, error) {
	desc := v.Root
	ix := first.First
	if first.NumLayers > 0 && strings.HasPrefix(ix.MediaType, "application/vnd.bdnvol.index.v") &&
		ix.MediaType != MediaTypeIndex && ix.MediaType != MediaTypeIndexV2 && ix.MediaType != MediaTypeIndexV3 && ix.MediaType != MediaTypeIndexV4 {
		return nil, nil, fmt.Errorf("%s: %w: file index of media type %q, a format newer than this bdnvol reads: upgrade bdnvol", desc.Digest, ErrInvalidIndex, ix.MediaType)
	}
	if first.NumLayers == 0 || (ix.MediaType != MediaTypeIndex && ix.MediaType != MediaTypeIndexV2 && ix.MediaType != MediaTypeIndexV3 && ix.MediaType != MediaTypeIndexV4) {
		return nil, nil, fmt.Errorf("%s: %w: first layer is not a file index", desc.Digest, ErrNotVolume)
	}
	v2 := ix.MediaType == MediaTypeIndexV2 || ix.MediaType == MediaTypeIndexV3 || ix.MediaType == MediaTypeIndexV4
	limit := int64(MaxIndexBytes)
	if v2 {
		limit = MaxTopIndexBytes
	}
	if ix.Size <= 0 || ix.Size > limit {
		return nil, nil, fmt.Errorf("%s: %w: file index of %d bytes", desc.Digest, ErrInvalidIndex, ix.Size)
	}
	v.Meta = append(v.Meta, ix)
	b, err := fetchAll(ctx, src, ix)
	if err != nil {
		return nil, nil, fmt.Errorf("file index %s of %s: %w", ix.Digest, desc.Digest, err)
	}
	if !v2 {
		x, err := DecodeIndex(b)
		if err != nil {
			return nil, nil, fmt.Errorf("file index %s of %s: %w", ix.Digest, desc.Digest, err)
		}
		return x, nil, nil
	}
	top, err := decodeTop(b)
	if err != nil {
		return nil, nil, fmt.Errorf("file index %s of %s: %w", ix.Digest, desc.Digest, err)
	}
	if ix.MediaType != indexMediaType(top.Version) {
		return nil, nil, fmt.Errorf("file index %s of %s: %w: format version %d under media type %q", ix.Digest, desc.Digest, ErrInvalidIndex, top.Version, ix.MediaType)
	}
	rd := newV2Reader(top, skipEdges)
	return rd.x, rd, nil
}

// layerCheck matches the layers after the file index, in order, against
// the index: its pieces first (version 2), read as they come, then one
// layer per chunk.
type layerCheck struct {
	src   content.Fetcher
	v     *Version
	x     *Index
	rd    *v2Reader   // nil for a version 1 index
	next  int         // chunks matched
	ahead *pieceAhead // pieces being fetched ahead of match
	// deltasRead tells whether the delta table (version 3) was read; bases
	// are the base chunk layers expected after the chunk layers.
	deltasRead bool
	bases      []ocispec.Descriptor
	nextBase   int
}

// match checks the next layer ll.
func (m *layerCheck) match(ctx context.Context, ll layer) error {
	desc, x, rd := m.v.Root, m.x, m.rd
	if rd != nil && rd.next < len(rd.top.Pieces) {
		l := ll.desc()
		p := rd.top.Pieces[rd.next]
		if l.Digest != p.Digest || l.Size != p.Size || l.MediaType != MediaTypePiece {
			return fmt.Errorf("%s: %w: layer %s does not match index piece %s", desc.Digest, ErrInvalidIndex, l.Digest, p.Digest)
		}
		pb, err := m.ahead.take(ctx, l)
		if errors.Is(err, errNotAhead) {
			pb, err = fetchAll(ctx, m.src, l)
		}
		if err != nil {
			return fmt.Errorf("index piece %s of %s: %w", l.Digest, desc.Digest, err)
		}
		if err := rd.add(pb); err != nil {
			return fmt.Errorf("index piece %s of %s: %w", l.Digest, desc.Digest, err)
		}
		m.v.Meta = append(m.v.Meta, l)
		return nil
	}
	if rd != nil && rd.top.Deltas != nil && !m.deltasRead {
		return m.readDeltas(ctx, ll.desc())
	}
	if m.next >= x.NumChunks() {
		return m.matchBase(ll)
	}
	if d, ok := x.Delta(m.next); ok {
		if l := ll.desc(); l.MediaType != MediaTypeChunkDelta || l.Digest != d.Digest || l.Size != d.DeltaSize {
			return fmt.Errorf("%s: %w: layer %d (%s) does not match the delta %s of chunk %s", desc.Digest, ErrInvalidIndex, m.next+1, l.Digest, d.Digest, d.Chunk)
		}
		m.next++
		return nil
	}
	if sum, size, ok := ll.chunk(); !ok || !x.chunkIs(m.next, &sum, size) {
		return fmt.Errorf("%s: %w: layer %d (%s) does not match chunk %s", desc.Digest, ErrInvalidIndex, m.next+1, ll.desc().Digest, x.ChunkDigest(m.next))
	}
	m.next++
	return nil
}

// readDeltas fetches and checks the delta table of a version 3 index, the
// layer l after its pieces.
func (m *layerCheck) readDeltas(ctx context.Context, l ocispec.Descriptor) error {
	desc, rd, x := m.v.Root, m.rd, m.x
	ref := rd.top.Deltas
	if rd.next != len(rd.top.Pieces) {
		return fmt.Errorf("%s: %w: %d of %d index pieces before the delta table", desc.Digest, ErrInvalidIndex, rd.next, len(rd.top.Pieces))
	}
	if l.MediaType != MediaTypeDeltas || l.Digest != ref.Digest || l.Size != ref.Size {
		return fmt.Errorf("%s: %w: layer %s is not the delta table %s", desc.Digest, ErrInvalidIndex, l.Digest, ref.Digest)
	}
	b, err := m.ahead.take(ctx, l)
	if errors.Is(err, errNotAhead) {
		b, err = fetchAll(ctx, m.src, l)
	}
	if err != nil {
		return fmt.Errorf("delta table %s of %s: %w", l.Digest, desc.Digest, err)
	}
	var t deltaTable
	if err := strictDecode(b, &t, "delta table"); err != nil {
		return fmt.Errorf("delta table %s of %s: %w", l.Digest, desc.Digest, err)
	}
	if int64(len(t.Deltas)) != ref.Count {
		return fmt.Errorf("%s: %w: the delta table holds %d deltas, the index says %d", desc.Digest, ErrInvalidIndex, len(t.Deltas), ref.Count)
	}
	at := make([]int, len(t.Deltas))
	isDelta := make(map[digest.Digest]bool, len(t.Deltas))
	for i, d := range t.Deltas {
		sum, ok := SHA256Sum(d.Chunk)
		k, found := 0, false
		if ok {
			k, found = x.ch.lookup(&sum)
		}
		if !found || (i > 0 && k <= at[i-1]) {
			return fmt.Errorf("%s: %w: delta %d names chunk %s, not a chunk of the version after the one before", desc.Digest, ErrInvalidIndex, i, d.Chunk)
		}
		at[i] = k
		isDelta[d.Chunk] = true
	}
	for i, d := range t.Deltas {
		if err := checkDelta(d, x.ChunkSize(at[i]), isDelta[d.Base]); err != nil {
			return fmt.Errorf("%s: %w", desc.Digest, err)
		}
	}
	for i := range t.Deltas {
		t.Deltas[i].Format = rd.top.Version
	}
	x.setDeltas(t.Deltas, at)
	m.bases = x.Bases()
	m.deltasRead = true
	m.v.Meta = append(m.v.Meta, l)
	return nil
}

// matchBase checks a layer after the chunk layers: the next base chunk of
// the version's deltas.
func (m *layerCheck) matchBase(ll layer) error {
	desc := m.v.Root
	if m.nextBase >= len(m.bases) {
		return fmt.Errorf("%s: %w: more chunk layers than the %d chunks", desc.Digest, ErrInvalidIndex, m.x.NumChunks())
	}
	want := m.bases[m.nextBase]
	if l := ll.desc(); l.MediaType != MediaTypeChunk || l.Digest != want.Digest || l.Size != want.Size {
		return fmt.Errorf("%s: %w: layer %s does not match base chunk %s", desc.Digest, ErrInvalidIndex, l.Digest, want.Digest)
	}
	m.nextBase++
	return nil
}

// finish checks that every piece and every chunk had its layer, and sets
// the version's index, compacted.
func (m *layerCheck) finish(skipEdges bool) error {
	desc := m.v.Root
	if m.rd != nil {
		if _, err := m.rd.done(); err != nil {
			return fmt.Errorf("%s: %w", desc.Digest, err)
		}
	}
	if m.rd != nil && m.rd.top.Deltas != nil && !m.deltasRead {
		return fmt.Errorf("%s: %w: no delta table layer", desc.Digest, ErrInvalidIndex)
	}
	if m.next != m.x.NumChunks() {
		return fmt.Errorf("%s: %w: %d chunk layers for %d chunks", desc.Digest, ErrInvalidIndex, m.next, m.x.NumChunks())
	}
	if m.nextBase != len(m.bases) {
		return fmt.Errorf("%s: %w: %d of %d base chunk layers", desc.Digest, ErrInvalidIndex, m.nextBase, len(m.bases))
	}
	if err := m.x.compact(skipEdges); err != nil {
		return fmt.Errorf("%s: %w", desc.Digest, err)
	}
	m.v.Index = m.x
	return nil
}

// NumChunks returns the number of chunks of the version.
func (v *Version) NumChunks() int { return v.Index.NumChunks() }

// Chunk returns the descriptor of the blob of chunk k of the index.
func (v *Version) Chunk(k int) ocispec.Descriptor { return v.Index.ChunkDescriptor(k) }

// ChunkDescriptors returns the descriptors of all the chunks, in index order.
func (v *Version) ChunkDescriptors() []ocispec.Descriptor {
	out := make([]ocispec.Descriptor, v.NumChunks())
	for k := range out {
		out[k] = v.Chunk(k)
	}
	return out
}

// fetchPart fetches the part manifest pd of the root index root.
func fetchPart(ctx context.Context, src content.Fetcher, root, pd ocispec.Descriptor) (*manifestOrIndex, error) {
	part, err := fetchManifest(ctx, src, pd, 0)
	if err != nil {
		return nil, fmt.Errorf("part %s of %s: %w", pd.Digest, root.Digest, err)
	}
	if part.MediaType != ocispec.MediaTypeImageManifest || part.ArtifactType != ArtifactTypePart {
		return nil, fmt.Errorf("part %s of %s: %w: not a part manifest", pd.Digest, root.Digest, ErrInvalidIndex)
	}
	return part, nil
}

// manifestOrIndex holds the fields of a manifest or an index that Open
// reads. A part manifest lists 20,000 layers: those that are plain chunk
// descriptors (the chunk media type, a SHA-256 digest, a size, nothing
// else) are held as 48-byte records, against some 250 bytes for an
// ocispec.Descriptor; eachLayer gives them back as they were decoded.
type manifestOrIndex struct {
	MediaType    string
	ArtifactType string
	Config       ocispec.Descriptor
	Manifests    []ocispec.Descriptor
	NumLayers    int                // the number of layers
	First        ocispec.Descriptor // the first layer, when there is one

	layers []layerRec
	others []ocispec.Descriptor // the layers that are not plain chunk descriptors
}

// layerBytes is about the smallest encoding of a chunk layer.
const layerBytes = 128

// layerRec is a layer of a manifestOrIndex: a plain chunk descriptor, or
// an index into others.
type layerRec struct {
	sum   [sha256Len]byte
	size  int64
	other int32 // index in others, -1 for a plain chunk descriptor
}

// addLayer appends the next layer l.
func (m *manifestOrIndex) addLayer(l ocispec.Descriptor) {
	if m.NumLayers == 0 {
		m.First = l
	}
	m.NumLayers++
	if l.MediaType == MediaTypeChunk && l.URLs == nil && l.Annotations == nil && l.Data == nil && l.Platform == nil && l.ArtifactType == "" {
		if sum, ok := SHA256Sum(l.Digest); ok {
			m.layers = append(m.layers, layerRec{sum: sum, size: l.Size, other: -1})
			return
		}
	}
	m.layers = append(m.layers, layerRec{other: int32(len(m.others))})
	m.others = append(m.others, l)
}

// eachLayer calls fn with each layer of m in order, stopping at its first
// error.
func (m *manifestOrIndex) eachLayer(fn func(layer) error) error {
	for i := range m.layers {
		if err := fn(layer{m, i}); err != nil {
			return err
		}
	}
	return nil
}

// layer is layer i of a manifestOrIndex.
type layer struct {
	m *manifestOrIndex
	i int
}

// desc returns the layer as it was decoded.
func (l layer) desc() ocispec.Descriptor {
	r := &l.m.layers[l.i]
	if r.other >= 0 {
		return l.m.others[r.other]
	}
	return ocispec.Descriptor{MediaType: MediaTypeChunk, Digest: SHA256Digest(&r.sum), Size: r.size}
}

// chunk returns the digest bytes and the size of a layer with the chunk
// media type and a SHA-256 digest in its canonical form; ok is false for
// any other layer.
func (l layer) chunk() (sum [sha256Len]byte, size int64, ok bool) {
	r := &l.m.layers[l.i]
	if r.other < 0 {
		return r.sum, r.size, true
	}
	d := l.m.others[r.other]
	sum, ok = SHA256Sum(d.Digest)
	return sum, d.Size, ok && d.MediaType == MediaTypeChunk
}

// fetchManifest fetches the manifest desc (at most MaxManifestBytes) and
// decodes it as it comes, refusing more than maxManifestLayers layers or
// maxManifests manifests before decoding them. The decoded manifest is
// used once every byte is verified; a decoding error is reported only then.
func fetchManifest(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor, maxManifests int) (*manifestOrIndex, error) {
	if desc.Size <= 0 || desc.Size > MaxManifestBytes {
		return nil, fmt.Errorf("manifest %s: %w: size %d", desc.Digest, ErrInvalidIndex, desc.Size)
	}
	var m *manifestOrIndex
	var derr error
	err := FetchRetrying(ctx, src, func() error {
		return verify.FetchTo(ctx, src, "", desc, func(r io.Reader) { m, derr = decodeManifest(r, maxManifests, desc.Size) })
	})
	if err != nil {
		return nil, fmt.Errorf("manifest %s: %w", desc.Digest, err)
	}
	if err := derr; err != nil {
		return nil, fmt.Errorf("manifest %s: %w: %v", desc.Digest, ErrNotVolume, err)
	}
	if m.MediaType == "" {
		m.MediaType = desc.MediaType
	}
	return m, nil
}

// decodeManifest decodes the fields Open reads from a manifest or index,
// one descriptor at a time so that a list longer than its bound is refused
// before it is held. Keys match exactly; a key given twice is refused. size
// is the manifest's, to size the list of layers.
func decodeManifest(r io.Reader, maxManifests int, size int64) (*manifestOrIndex, error) {
	dec := json.NewDecoder(r)
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object")
	}
	// A chunk layer takes some 140 bytes; the bound caps what a manifest
	// of another kind makes this allocate.
	m := &manifestOrIndex{layers: make([]layerRec, 0, min(maxManifestLayers, size/layerBytes))}
	seen := map[string]bool{}
	// list decodes a list of descriptors, passing each to each.
	list := func(name string, max int, each func(d ocispec.Descriptor)) error {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		if t == nil {
			return nil
		}
		if t != json.Delim('[') {
			return fmt.Errorf("%s: not an array", name)
		}
		for n := 0; dec.More(); n++ {
			if n >= max {
				return fmt.Errorf("more than %d %s", max, name)
			}
			var d ocispec.Descriptor
			if err := dec.Decode(&d); err != nil {
				return fmt.Errorf("%s: %v", name, err)
			}
			each(d)
		}
		_, err = dec.Token()
		return err
	}
	manifests := func(d ocispec.Descriptor) { m.Manifests = append(m.Manifests, d) }
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := t.(string)
		if seen[key] {
			return nil, fmt.Errorf("key %q twice", key)
		}
		seen[key] = true
		switch key {
		case "mediaType":
			err = dec.Decode(&m.MediaType)
		case "artifactType":
			err = dec.Decode(&m.ArtifactType)
		case "config":
			err = dec.Decode(&m.Config)
		case "layers":
			err = list(key, maxManifestLayers, m.addLayer)
		case "manifests":
			err = list(key, maxManifests, manifests)
		default:
			var skip json.RawMessage
			err = dec.Decode(&skip)
		}
		if err != nil {
			return nil, err
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("data after the object")
	}
	return m, nil
}

// localSource is implemented by sources that read local files: reading a
// file again does not cure what was wrong with it.
type localSource interface{ Local() bool }

// fetchAll fetches and verifies a whole blob, fetching it again when the
// body is cut short or its bytes do not match (bounded, like chunks), unless
// src reads local files. It never reads more than desc.Size bytes.
func fetchAll(ctx context.Context, src content.Fetcher, desc ocispec.Descriptor) ([]byte, error) {
	var b []byte
	err := FetchRetrying(ctx, src, func() (err error) {
		b, err = verify.Fetch(ctx, src, "", desc) // the callers name the object
		return err
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// FetchRetrying runs fetch, a fetch from src, again when it fails in a way
// another try may cure (a body cut short or corrupted in transit; not a
// missing blob, nor any failure of a local layout), a bounded number of
// times with a growing pause, as fetchAll does.
func FetchRetrying(ctx context.Context, src content.Fetcher, fetch func() error) error {
	attempts := fetchAttempts
	if l, ok := src.(localSource); ok && l.Local() {
		attempts = 1
	}
	for attempt := 1; ; attempt++ {
		err := fetch()
		if err == nil {
			return nil
		}
		if attempt >= attempts || !refetchable(ctx, err) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
}

// ErrDigestMismatch is wrapped when fetched or written bytes do not match
// their digest: it is verify.ErrDigestMismatch, the one sentinel.
var ErrDigestMismatch = verify.ErrDigestMismatch

// fetchAttempts bounds the fetches of one chunk: a body cut short or
// corrupted in transit is fetched again.
const fetchAttempts = 3

// refetchable reports whether fetching a chunk again may succeed.
func refetchable(ctx context.Context, err error) bool {
	return ctx.Err() == nil && !errors.Is(err, errdef.ErrNotFound)
}
