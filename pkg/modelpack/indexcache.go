package modelpack

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/bounded"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// DefaultIndexCacheBytes bounds an IndexCache opened with no bound: the
// records it holds together, least recently used dropped first.
const DefaultIndexCacheBytes = 256 << 20

// indexRecordMagic starts every record; the version of the record format
// is its last byte.
const indexRecordMagic = "bdnvol-modelpack-index\x01"

// IndexCache keeps the file indexes Build derives from models, by manifest
// digest, so that a later Open of the same model reads its manifest and
// no layer. A record is checked whole on every read (its checksum, the
// manifest it names, the index's own validation, and every file and chunk
// against the layers of the verified manifest): a torn or altered record
// is removed and the model read again, never trusted.
//
// Records are kept per origin (For), as the chunk cache serves blobs: an
// index derived from one repository's layers is not handed to a reader of
// another that only names the same manifest.
type IndexCache struct {
	dir    string
	max    int64
	mu     *sync.Mutex // serialises this process's writes and evictions
	origin string      // "" unscoped; else the origin of this view's records
}

// OpenIndexCache returns the cache in dir (created on first write), bounded
// to max bytes (DefaultIndexCacheBytes when max <= 0).
func OpenIndexCache(dir string, max int64) *IndexCache {
	if max <= 0 {
		max = DefaultIndexCacheBytes
	}
	return &IndexCache{dir: dir, max: max, mu: new(sync.Mutex)}
}

// For returns the view of c whose records are those derived from models
// read from origin (as chunkcache.Cache.For names it); "" is the unscoped
// view.
func (c *IndexCache) For(origin string) *IndexCache {
	v := *c
	v.origin = origin
	return &v
}

// Dir returns the cache's directory.
func (c *IndexCache) Dir() string { return c.dir }

var processCache atomic.Pointer[IndexCache]

// UseIndexCache makes Open, in this process, look for a model's index in c
// before reading its layers, and keep the indexes it derives there; nil
// turns that off.
func UseIndexCache(c *IndexCache) { processCache.Store(c) }

// indexRecord is what a record holds: the manifest's digest, where each
// file of the model lies in which layer (in the order Build listed them),
// and the encoded file index.
type indexRecord struct {
	Manifest digest.Digest   `json:"manifest"`
	Files    []fileRecord    `json:"files"`
	Index    json.RawMessage `json:"index"`
}

type fileRecord struct {
	Path   string `json:"path"`
	Layer  int    `json:"layer"`
	Offset int64  `json:"offset"`
}

// name is the record file of the manifest d for c's origin.
func (c *IndexCache) name(d digest.Digest) string {
	n := d.Algorithm().String() + "-" + d.Encoded()
	if c.origin != "" {
		sum := sha256.Sum256([]byte(c.origin))
		n += "-" + hex.EncodeToString(sum[:12])
	}
	return filepath.Join(c.dir, n)
}

// Load returns the map of the model a from its record, or false when
// there is none or it does not check (then it is removed).
func (c *IndexCache) Load(a *Artifact) (*Map, bool) {
	if a.Desc.Digest.Validate() != nil {
		return nil, false
	}
	p := c.name(a.Desc.Digest)
	b, err := readBounded(p, c.max)
	if err != nil {
		return nil, false
	}
	m, err := decodeRecord(a, b)
	if err != nil {
		os.Remove(p) // torn or altered: derived again by the caller
		return nil, false
	}
	now := time.Now()
	_ = os.Chtimes(p, now, now) // most recently used
	return m, true
}

// readBounded reads the file p if it is a regular file of at most max bytes.
func readBounded(p string, max int64) ([]byte, error) {
	b, err := bounded.ReadFile(p, max)
	if err != nil {
		return nil, fmt.Errorf("%s: not a record: %w", p, err)
	}
	return b, nil
}

// Store writes the record of m (atomically: a temporary file renamed into
// place), then drops the least recently used records past the bound. A
// record larger than the bound is not kept.
func (c *IndexCache) Store(m *Map) error {
	b, err := encodeRecord(m)
	if err != nil {
		return err
	}
	if int64(len(b)) > c.max {
		return fmt.Errorf("modelpack: the index of %s takes %d bytes, more than the cache's bound of %d", m.Artifact.Desc.Digest, len(b), c.max)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(c.dir, ".tmp-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), c.name(m.Artifact.Desc.Digest))
	}
	if err != nil {
		os.Remove(tmp.Name())
		return err
	}
	c.evict()
	return nil
}

// encodeRecord encodes the record of m: what an IndexCache keeps and a
// published index holds (see PublishIndex).
func encodeRecord(m *Map) ([]byte, error) {
	if m.encoded == nil {
		return nil, errors.New("modelpack: the map has no encoded index to keep")
	}
	rec := indexRecord{Manifest: m.Artifact.Desc.Digest, Index: m.encoded, Files: make([]fileRecord, len(m.Files))}
	for i, f := range m.Files {
		rec.Files[i] = fileRecord{Path: f.Path, Layer: f.Layer, Offset: f.Offset}
	}
	body, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	b := make([]byte, 0, len(indexRecordMagic)+len(sum)+len(body))
	return append(append(append(b, indexRecordMagic...), sum[:]...), body...), nil
}

// evict removes the least recently used records (and temporary files
// older than an hour, left by a process that died writing) until the
// records fit the bound.
func (c *IndexCache) evict() {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return
	}
	type rec struct {
		path string
		size int64
		used time.Time
	}
	var recs []rec
	var total int64
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		p := filepath.Join(c.dir, e.Name())
		if strings.HasPrefix(e.Name(), ".tmp-") {
			if time.Since(fi.ModTime()) > time.Hour {
				os.Remove(p)
			}
			continue
		}
		recs = append(recs, rec{p, fi.Size(), fi.ModTime()})
		total += fi.Size()
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].used.Before(recs[j].used) })
	for _, r := range recs {
		if total <= c.max {
			break
		}
		if err := os.Remove(r.path); err == nil || errors.Is(err, os.ErrNotExist) {
			total -= r.size
		}
	}
}

// errRecord is a record that does not check.
var errRecord = errors.New("modelpack: index record does not check")

// decodeRecord checks the record b against the artifact a and returns
// the map it describes.
func decodeRecord(a *Artifact, b []byte) (*Map, error) {
	if len(b) < len(indexRecordMagic)+sha256.Size || string(b[:len(indexRecordMagic)]) != indexRecordMagic {
		return nil, fmt.Errorf("%w: no header", errRecord)
	}
	sum, body := b[len(indexRecordMagic):len(indexRecordMagic)+sha256.Size], b[len(indexRecordMagic)+sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, fmt.Errorf("%w: checksum", errRecord)
	}
	var rec indexRecord
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return nil, fmt.Errorf("%w: %v", errRecord, err)
	}
	if rec.Manifest != a.Desc.Digest {
		return nil, fmt.Errorf("%w: it is of %s", errRecord, rec.Manifest)
	}
	if len(rec.Files) > MaxFiles {
		return nil, fmt.Errorf("%w: %d files", errRecord, len(rec.Files))
	}
	x, err := layout.DecodeIndex(rec.Index)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errRecord, err)
	}
	if x.Chunking != Params || x.Version != layout.FormatVersion1 {
		return nil, fmt.Errorf("%w: chunking %+v", errRecord, x.Chunking)
	}
	m := &Map{Artifact: a, Index: x, Pieces: map[digest.Digest]Piece{}, encoded: rec.Index}
	regular := 0
	for i := 0; i < x.Len(); i++ {
		if x.Kind(i) == layout.TypeFile {
			regular++
		} else if x.Kind(i) != layout.TypeDir {
			return nil, fmt.Errorf("%w: %s is a %s", errRecord, x.Path(i), x.Kind(i))
		}
	}
	if regular != len(rec.Files) {
		return nil, fmt.Errorf("%w: %d files for the index's %d", errRecord, len(rec.Files), regular)
	}
	seen := make(map[string]bool, len(rec.Files))
	for _, fr := range rec.Files {
		f, err := checkFile(a, x, fr)
		if err != nil || seen[f.Path] {
			return nil, fmt.Errorf("%w: file %q: %v", errRecord, fr.Path, err)
		}
		seen[f.Path] = true
		i, _ := x.Find(f.Path)
		off := f.Offset
		for k := 0; k < x.NumExtents(i); k++ {
			e := x.Extent(i, k)
			if _, ok := m.Pieces[x.ChunkDigest(e.Chunk)]; !ok {
				m.Pieces[x.ChunkDigest(e.Chunk)] = Piece{Layer: f.Layer, Offset: off, Size: e.Length}
			}
			off += e.Length
		}
		m.Files = append(m.Files, f)
	}
	return m, nil
}

// checkFile checks one file of a record against the index and the layer
// it names, and returns it as Build would have listed it.
func checkFile(a *Artifact, x *layout.Index, fr fileRecord) (File, error) {
	i, ok := x.Find(fr.Path)
	if !ok || x.Kind(i) != layout.TypeFile {
		return File{}, errors.New("not a file of the index")
	}
	if fr.Layer < 0 || fr.Layer >= len(a.Layers) {
		return File{}, fmt.Errorf("layer %d of %d", fr.Layer, len(a.Layers))
	}
	e := x.File(i)
	l := a.Layers[fr.Layer]
	bound := l.Desc.Size
	if !l.Packing.RangeReadable() {
		bound = l.Desc.Size*maxExpand + maxExpandSlack
	}
	switch {
	case fr.Offset < 0 || e.Size < 0 || fr.Offset > bound-e.Size:
		return File{}, fmt.Errorf("%d bytes at %d of a layer of %d", e.Size, fr.Offset, bound)
	case l.Packing == PackingRaw && (fr.Offset != 0 || e.Size != l.Desc.Size || fr.Path != l.Path):
		return File{}, errors.New("not the raw layer's file")
	case l.Packing == PackingRaw && e.Mode != l.Mode:
		return File{}, errors.New("not the raw layer's mode")
	}
	var n int64
	for k := 0; k < x.NumExtents(i); k++ {
		ext := x.Extent(i, k)
		if ext.Offset != 0 || ext.Length != x.ChunkSize(ext.Chunk) {
			return File{}, fmt.Errorf("extent %d is not a whole chunk", k)
		}
		n += ext.Length
	}
	if n != e.Size {
		return File{}, fmt.Errorf("extents of %d bytes for a file of %d", n, e.Size)
	}
	return File{Path: e.Path, Layer: fr.Layer, Offset: fr.Offset, Size: e.Size, Mode: e.Mode, Lazy: l.Packing.RangeReadable(), Digest: e.Digest}, nil
}
