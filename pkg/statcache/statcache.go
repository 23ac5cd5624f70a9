package statcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// Cache remembers, per directory tree and chunking parameters, each
// file's digest and chunk list by its stat key (size, mtime, ctime, inode),
// so a re-push of an unchanged tree reads no file data. A nil *Cache is
// valid and remembers nothing.
type Cache struct {
	path  string
	since int64            // entries whose mtime is newer than this are not trusted
	now   func() time.Time // the clock Save marks racy entries by; time.Now if nil

	mu    sync.Mutex
	data  statCacheData // this run's records (and an older format's)
	dirty bool
	// disk is the record file read at open, mapped; keeps are the prunes
	// since, which its records must pass.
	disk   *recFile
	keeps  []func(p string) bool
	legacy string // an older format's file, removed once saved anew
	// freshSeq, when set, gives a push's records in path order as Save
	// writes them, from what the push holds anyway: they are not copied
	// here file by file.
	freshSeq iter.Seq[FreshRecord]
	// The files a pull wrote or kept, held compactly: entries of index px
	// by number, with their stat keys; digests and extents come from px
	// when a record is needed (Save writes them as the other records).
	px      *layout.Index
	pstat   []pulledStat
	pkind   []uint8 // pulledNone, pulledDigest, pulledWithExtents or pulledUnverified
	horizon int64   // after a Save: what decided Racy for the pulled; 0 before
	// settleBytes overrides settleMin (tests).
	settleBytes int64
}

// FreshRecord is a record a push made: a file's stat key, digest and,
// for a large file, chunks.
type FreshRecord struct {
	Path   string
	Stat   Key
	Sum    [sha256.Size]byte
	Chunks []layout.Chunk // a large file's; nil for a packed one
}

// SetFresh makes seq (records in increasing path order, one per path)
// the records this run stored; it is read when the cache is saved.
func (c *Cache) SetFresh(seq iter.Seq[FreshRecord]) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.freshSeq = seq
	c.dirty = true
}

// trusts reports whether a record of a file with stat key k can be kept:
// a file changed within the clock's resolution of the cache's opening may
// still change unseen.
func (c *Cache) trusts(k Key) bool {
	return k.Mtime < c.since && k.Ctime < c.since
}

func (r *FreshRecord) file() Record {
	return Record{Stat: r.Stat, Digest: layout.SHA256Digest(&r.Sum), Chunks: r.Chunks}
}

// pulledStat is a pulled file's stat key less its size, which is its
// entry's.
type pulledStat struct {
	mtime, ctime int64
	ino          uint64
}

// What a compact pulled record holds besides its stat key.
const (
	pulledNone        = iota
	pulledDigest      // the digest only (a file written whole from a pack)
	pulledWithExtents // the digest and the extents
	pulledUnverified  // the extents, and a digest the index claims but no one checked
)

type statCacheData struct {
	Files map[string]Record       `json:"files"`
	Packs map[string]layout.Chunk `json:"packs"`
}

// Record is what the cache records of one file: its stat key, digest,
// and, for a file a pull wrote, where the version's chunks are in it.
type Record struct {
	Stat   Key            `json:"k"`
	Digest digest.Digest  `json:"d"`
	Chunks []layout.Chunk `json:"c,omitempty"`
	// Extents, for a file a pull wrote, are where the version's chunks are
	// in it: a later pull (an upgrade) copies them from there.
	Extents []pulledExtent `json:"x,omitempty"`
	// Unverified, for a file a pull wrote, says its digest is what the
	// index claims and was not checked against its bytes, which are only
	// known to be its extents' chunks: lookup does not return it, and a
	// later pull trusts it only for a file with the same extents.
	Unverified bool `json:"u,omitempty"`
	// Racy is set when the file changed too shortly before the cache was
	// saved for its stat key to prove it unchanged since: its digest is
	// then not trusted, its extents are still a hint (copies are verified).
	Racy   bool `json:"r,omitempty"`
	pulled bool // stored by this pull: Save decides Racy
}

// pulledExtent is one extent of a pulled file: its length and, when it
// holds a whole chunk, that chunk's digest.
type pulledExtent struct {
	Digest digest.Digest `json:"d,omitempty"`
	Length int64         `json:"n"`
}

// racyMargin is how long after a file last changed its stat key proves it
// unchanged: more than the granularity of file timestamps.
const racyMargin = 100 * time.Millisecond

// Open loads, from the cache directory dir, the cache of the tree
// named key (a local directory, whose absolute path is used, or a source
// URL). A missing cache starts empty; a torn or corrupt one is refused and
// rewritten on the next save. Records an older format wrote (JSON) are
// read once and kept as racy: their files are hashed again on first use.
func Open(dir, key string, p layout.Params) *Cache {
	if !strings.Contains(key, "://") {
		if abs, err := filepath.Abs(key); err == nil {
			key = abs
		}
	}
	// The name changes when what the cache holds does (v2: chunk edges).
	h := sha256.Sum256([]byte(fmt.Sprintf("v2\x00%s\x00%d/%d/%d", key, p.Min, p.Avg, p.Max)))
	base := filepath.Join(dir, "stat", hex.EncodeToString(h[:16]))
	c := &Cache{
		path:  base + ".rec",
		since: time.Now().Add(-2 * time.Second).UnixNano(),
		data:  statCacheData{Files: map[string]Record{}},
	}
	r, err := openRecFile(c.path)
	switch {
	case err == nil:
		if c.data.Packs, err = r.packs(); err != nil {
			r.close()
			c.dirty = true
		} else {
			c.disk = r
		}
	case errors.Is(err, errRecFile):
		c.dirty = true // refused: the next save writes it anew
	default:
		c.legacy = base + ".json"
		c.readLegacy()
	}
	if c.data.Packs == nil {
		c.data.Packs = map[string]layout.Chunk{}
	}
	return c
}

// readLegacy reads the records of the JSON format before format 3, all of
// them racy: a record written before Unverified existed may claim a digest
// no one checked, so each file is hashed again on its first use (what a
// push or pull of a tree with no records costs, once).
func (c *Cache) readLegacy() {
	b, err := os.ReadFile(c.legacy)
	if err != nil {
		c.legacy = ""
		return
	}
	_ = json.Unmarshal(b, &c.data)
	if c.data.Files == nil {
		c.data.Files = map[string]Record{}
	}
	for p, f := range c.data.Files {
		f.Racy = true
		c.data.Files[p] = f
	}
	c.dirty = true
}

// get returns the record of p: this run's, else the pulled one held
// compactly, else the one on disk. Called with c.mu held.
func (c *Cache) get(p string) (Record, bool) {
	if f, ok := c.data.Files[p]; ok {
		return f, true
	}
	if f, ok := c.pulledRecord(p); ok {
		return f, true
	}
	if c.disk != nil && c.kept(p) {
		return c.disk.find(p)
	}
	return Record{}, false
}

// kept reports whether no prune dropped p. Called with c.mu held.
func (c *Cache) kept(p string) bool {
	for _, keep := range c.keeps {
		if !keep(p) {
			return false
		}
	}
	return true
}

// Lookup returns the trusted record of the file at p with stat key k: one
// whose digest was checked against its bytes, and not racy.
func (c *Cache) Lookup(p string, k Key) (Record, bool) {
	if c == nil {
		return Record{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	f, ok := c.get(p)
	if !ok || f.Stat != k || f.Racy || f.pulled || f.Unverified {
		return Record{}, false
	}
	return f, true
}

// RecordedOther reports whether the cache holds a trusted record of what
// a pull wrote at p with stat key k, as a file whose digest (checked or
// not) is not d: the file's bytes are that record's chunks.
func (c *Cache) RecordedOther(p string, k Key, d digest.Digest) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rec, ok := c.get(p)
	return ok && rec.Stat == k && !rec.Racy && !rec.pulled && len(rec.Extents) > 0 && rec.Digest != d
}

// SameExtents reports whether the cache records that the file at p, with
// stat key k, was written by a pull from chunks that are, extent by extent,
// the whole chunks of entry f of x: then it holds f's bytes, whatever f's
// digest claims.
func (c *Cache) SameExtents(p string, k Key, f *layout.File, x *layout.Index) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	rec, ok := c.get(p)
	c.mu.Unlock()
	if !ok || rec.Stat != k || rec.Racy || rec.pulled || len(rec.Extents) != len(f.Extents) || len(f.Extents) == 0 {
		return false
	}
	for i, e := range pulledExtents(f, x) {
		if e.Digest == "" || e != rec.Extents[i] {
			return false
		}
	}
	return true
}

// StorePulled records entry p of index x, which a pull wrote or kept with
// stat key k, whatever its age: Save marks it racy if it changed too
// shortly before. With extents, the record tells where the version's
// chunks are in the file; verified says the pull checked the file's bytes
// against its digest (or the digest follows from its chunks'), which
// without extents it must have. The record is held compactly, by entry.
func (c *Cache) StorePulled(x *layout.Index, p string, k Key, extents, verified bool) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dirty = true
	i, ok := x.Find(p)
	if !ok || (c.px != nil && c.px != x) || k.Size != x.Size(i) {
		// Not an entry of the index held, or not of its size (cannot
		// happen in one pull): a record of its own.
		f := x.File(i)
		rec := Record{Stat: k, Digest: f.Digest, pulled: true, Unverified: !verified}
		if extents && ok {
			rec.Extents = pulledExtents(&f, x)
		}
		c.data.Files[p] = rec
		return
	}
	if c.px == nil {
		c.px = x
		c.pstat = make([]pulledStat, x.Len())
		c.pkind = make([]uint8, x.Len())
	}
	delete(c.data.Files, p) // an earlier pull's record, replaced
	c.pstat[i] = pulledStat{k.Mtime, k.Ctime, k.Ino}
	c.pkind[i] = pulledDigest
	switch {
	case extents && verified:
		c.pkind[i] = pulledWithExtents
	case extents:
		c.pkind[i] = pulledUnverified
	}
}

// pulledRecord returns the compact record of path p as a Record.
// Called with c.mu held.
func (c *Cache) pulledRecord(p string) (Record, bool) {
	if c.px == nil {
		return Record{}, false
	}
	i, ok := c.px.Find(p)
	if !ok || c.pkind[i] == pulledNone {
		return Record{}, false
	}
	return c.pulledAt(i), true
}

// pulledAt returns compact record i as a Record. Called with c.mu
// held.
func (c *Cache) pulledAt(i int) Record {
	f := c.px.File(i)
	ps := c.pstat[i]
	rec := Record{Stat: Key{Size: f.Size, Mtime: ps.mtime, Ctime: ps.ctime, Ino: ps.ino}, Digest: f.Digest}
	if c.pkind[i] >= pulledWithExtents {
		rec.Extents = pulledExtents(&f, c.px)
	}
	rec.Unverified = c.pkind[i] == pulledUnverified
	if c.horizon == 0 {
		rec.pulled = true
	} else {
		rec.Racy = rec.Stat.Mtime >= c.horizon || rec.Stat.Ctime >= c.horizon
	}
	return rec
}

// PulledFiles returns the records of what earlier pulls wrote, as they
// are now; a path no index could hold (the file on disk was edited) is
// left out. Those on disk are read from there when asked for.
func (c *Cache) PulledFiles() *PulledRecords {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := &PulledRecords{disk: c.disk, keeps: append([]func(string) bool(nil), c.keeps...), mem: map[string]Record{}}
	for p, f := range c.data.Files {
		out.mem[p] = f
	}
	for i, k := range c.pkind {
		if k != pulledNone {
			out.mem[c.px.Path(i)] = c.pulledAt(i)
		}
	}
	for p, f := range out.mem {
		if !isPulled(p, f) {
			delete(out.mem, p)
		}
	}
	out.keys = sortedKeys(out.mem)
	return out
}

// isPulled reports whether f at p is a record a pull could have written.
func isPulled(p string, f Record) bool {
	return (f.Extents != nil || f.Chunks == nil) && layout.CheckPath(p) == nil
}

// Pack returns the pack chunk recorded under key (the members of a pack
// of small files, by their stat keys).
func (c *Cache) Pack(key string) (layout.Chunk, bool) {
	if c == nil {
		return layout.Chunk{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.data.Packs[key]
	return ch, ok
}

// StorePack records ch, the pack of small files of key.
func (c *Cache) StorePack(key string, ch layout.Chunk) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.data.Packs[key] = ch
	c.dirty = true
}

// SavePulled ends a pull of x: it drops the records of paths that are not
// regular files of x (of those the pull selected, when sel is not nil: a
// partial pull keeps the records of the paths it left alone), settles the
// records of files written last (stat reads the stat key of the file at a
// path), and saves the cache.
func (c *Cache) SavePulled(ctx context.Context, x *layout.Index, sel func(p string) bool, stat func(p string) (Key, bool)) error {
	if c == nil {
		return nil
	}
	c.Prune(func(p string) bool {
		if sel != nil && !sel(p) {
			return true
		}
		i, ok := x.Find(p)
		return ok && x.Kind(i) == layout.TypeFile
	})
	c.settle(ctx, stat)
	_ = os.Remove(c.piecesPath())
	if err := c.save(); err != nil {
		return err
	}
	if sel != nil {
		return nil
	}
	return c.savePieces(x)
}

// SetTestHooks sets the clock Save marks racy records by (nil: time.Now)
// and the bytes of recent files that make settle wait (0: settleMin), for
// tests.
func (c *Cache) SetTestHooks(now func() time.Time, settleBytes int64) {
	c.now, c.settleBytes = now, settleBytes
}

// TrustRecent makes the cache keep the records of files changed just
// before it was opened, for tests that write a tree and push it at once.
func (c *Cache) TrustRecent() { c.since = math.MaxInt64 }

// Prune drops entries for paths keep refuses.
func (c *Cache) Prune(keep func(p string) bool) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := range c.data.Files {
		if !keep(p) {
			delete(c.data.Files, p)
			c.dirty = true
		}
	}
	for i, k := range c.pkind {
		if k != pulledNone && !keep(c.px.Path(i)) {
			c.pkind[i] = pulledNone
			c.dirty = true
		}
	}
	if c.disk == nil {
		return
	}
	c.keeps = append(c.keeps, keep)
	c.disk.walk(func(p, _ []byte) bool {
		if !keep(string(p)) {
			c.dirty = true
			return false
		}
		return true
	})
}

// settleMin is how many bytes of recently written files with extents make
// settle wait for them: hashing fewer on a later upgrade costs less than
// the wait.
const settleMin = 128 << 20

// settle, when a pull recorded files with extents (settleMin bytes or
// more) that changed less than racyMargin ago, waits until they are older
// than that (at most racyMargin) and looks at each again with stat: one
// unchanged keeps its record, which Save then does not mark racy, so a
// later upgrade copies its chunks without hashing them; one that changed
// loses its record. Without the wait, the files a pull writes last are
// racy, and an upgrade right after hashes them all.
func (c *Cache) settle(ctx context.Context, stat func(p string) (Key, bool)) {
	if c == nil {
		return
	}
	c.mu.Lock()
	horizon := c.clock().Add(-racyMargin).UnixNano()
	var recent []int
	var newest, bytes int64
	for i, k := range c.pkind {
		ps := c.pstat[i]
		if k != pulledNone && (ps.mtime >= horizon || ps.ctime >= horizon) {
			recent = append(recent, i)
			newest = max(newest, ps.mtime, ps.ctime)
			if k >= pulledWithExtents {
				bytes += c.px.Size(i)
			}
		}
	}
	c.mu.Unlock()
	least := int64(settleMin)
	if c.settleBytes > 0 {
		least = c.settleBytes
	}
	if len(recent) == 0 || bytes < least {
		return
	}
	wait := time.Duration(newest+int64(racyMargin)-c.clock().UnixNano()) + time.Millisecond
	select {
	case <-ctx.Done():
		return
	case <-time.After(wait):
	}
	for _, i := range recent {
		k, ok := stat(c.px.Path(i))
		c.mu.Lock()
		ps := c.pstat[i]
		if !ok || k != (Key{Size: c.px.Size(i), Mtime: ps.mtime, Ctime: ps.ctime, Ino: ps.ino}) {
			c.pkind[i] = pulledNone
		}
		c.mu.Unlock()
	}
}

// clock returns the time by the cache's clock.
func (c *Cache) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// Save writes the cache atomically if it changed. The pieces a pull kept
// (TakePulledPieces) no longer count after it.
func (c *Cache) Save() error {
	if c == nil {
		return nil
	}
	if err := os.Remove(c.piecesPath()); err != nil && !os.IsNotExist(err) {
		return err
	}
	return c.save()
}

// save is Save, pieces left alone.
func (c *Cache) save() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dirty {
		return nil
	}
	horizon := c.clock().Add(-racyMargin).UnixNano()
	c.horizon = horizon
	for p, f := range c.data.Files {
		if f.pulled {
			f.Racy = f.Stat.Mtime >= horizon || f.Stat.Ctime >= horizon
			f.pulled = false
			c.data.Files[p] = f
		}
	}
	if err := os.MkdirAll(filepath.Dir(c.path), 0o700); err != nil {
		return err
	}
	// Written record by record, merged in path order from this run's, the
	// pulled ones and those on disk: a cache of a million files is not
	// held a second time.
	if err := atomicfile.Write(c.path, 0o600, c.encode); err != nil {
		return err
	}
	if c.legacy != "" {
		_ = os.Remove(c.legacy)
		c.legacy = ""
	}
	c.dirty = false
	c.reopen()
	return nil
}

// reopen maps the record file just saved, which holds every record, and
// lets go of those held in memory. Called with c.mu held.
func (c *Cache) reopen() {
	r, err := openRecFile(c.path)
	if err != nil {
		return // what is in memory still stands
	}
	c.disk, c.keeps, c.freshSeq = r, nil, nil
	c.data.Files = map[string]Record{}
	c.px, c.pstat, c.pkind = nil, nil, nil
}

// encode writes the record file, one record at a time: this run's records
// before the pulled ones held compactly before those on disk, for a path
// more than one has. Called with c.mu held.
func (c *Cache) encode(w io.Writer) error {
	rw := newRecWriter(w)
	next, stop := iter.Pull(c.freshRecords())
	defer stop()
	cur, more := next()
	mem := sortedKeys(c.data.Files)
	// A fresh record stands for a path before any other.
	add := func(p string, f func() Record) {
		for more && cur.Path < p {
			rw.add(cur.Path, cur.file())
			cur, more = next()
		}
		if more && cur.Path == p {
			rw.add(p, cur.file())
			cur, more = next()
			return
		}
		rw.add(p, f())
	}
	pi := 0 // next compact record
	nextPulled := func() (string, bool) {
		for ; pi < len(c.pkind); pi++ {
			if c.pkind[pi] != pulledNone {
				return c.px.Path(pi), true
			}
		}
		return "", false
	}
	// upTo writes the records of this run and the pulled ones that sort
	// before p (all of them when last), and reports whether one is p.
	upTo := func(p string, last bool) bool {
		for {
			q, okp := nextPulled()
			switch {
			case len(mem) > 0 && (!okp || mem[0] <= q) && (last || mem[0] <= p):
				if okp && mem[0] == q {
					pi++
				}
				m := mem[0]
				add(m, func() Record { return c.data.Files[m] })
				if mem = mem[1:]; !last && rw.last == p {
					return true
				}
			case okp && (last || q <= p):
				k := pi
				add(q, func() Record { return c.pulledAt(k) })
				if pi++; !last && q == p {
					return true
				}
			default:
				return false
			}
		}
	}
	c.disk.each(func(p string, f Record) bool {
		if !upTo(p, false) && c.kept(p) {
			add(p, func() Record { return f })
		}
		return rw.err == nil
	})
	upTo("", true)
	for ; more; cur, more = next() {
		rw.add(cur.Path, cur.file())
	}
	return rw.finish(c.data.Packs)
}

// freshRecords yields this run's records (freshSeq's) in path order, the
// racy left out. Called with c.mu held.
func (c *Cache) freshRecords() iter.Seq[FreshRecord] {
	return func(yield func(FreshRecord) bool) {
		if c.freshSeq == nil {
			return
		}
		for r := range c.freshSeq {
			if c.trusts(r.Stat) && !yield(r) {
				return
			}
		}
	}
}

// pulledExtents lists where f's chunks are in it, for a later pull.
func pulledExtents(f *layout.File, x *layout.Index) []pulledExtent {
	out := make([]pulledExtent, len(f.Extents))
	for k, e := range f.Extents {
		out[k].Length = e.Length
		if e.Offset == 0 && e.Length == x.ChunkSize(e.Chunk) {
			out[k].Digest = x.ChunkDigest(e.Chunk)
		}
	}
	return out
}

// Dir returns the directory the cache's files are kept in.
func (c *Cache) Dir() string { return filepath.Dir(c.path) }
