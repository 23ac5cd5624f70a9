package statcache

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// The stat records on disk (format 3): a sorted binary file, mapped and
// binary-searched, never decoded whole.
//
//	header  "BDNVREC\x00", u32 format
//	records one per path, sorted by path (see appendRecord)
//	offsets u64 per record: where it starts
//	packs   uvarint count, then per pack: its key (a digest) and its chunk
//	trailer u64 records, u64 offsets at, u64 packs at,
//	        SHA-256 of all bytes before it, "BDNVEND\x00"
//
// Integers are little-endian; a file whose checksum, magic or bounds do
// not hold is refused (the cache starts empty and the next save rewrites
// it).
const (
	recMagic      = "BDNVREC\x00"
	recEnd        = "BDNVEND\x00"
	recFormat     = 3
	recHeaderLen  = len(recMagic) + 4
	recTrailerLen = 3*8 + sha256.Size + len(recEnd)
)

// errRecFile is wrapped when a record file is torn or corrupt.
var errRecFile = errors.New("layout: stat record file is torn or corrupt")

// Record flags.
const (
	recUnverified = 1 << iota
	recRacy
	recChunks  // Chunks is not nil
	recExtents // Extents is not nil
)

// recFile is an open record file: its bytes mapped, its records found by
// binary search over the offsets.
type recFile struct {
	data    []byte // the whole file, mapped
	n       int
	offsAt  int
	packsAt int
	finds   atomic.Int64 // lookups, for releasing the pages they touched
}

// openRecFile maps the record file at path after checking its checksum,
// read through a buffer so that the check leaves no page mapped.
func openRecFile(path string) (*recFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	if size < int64(recHeaderLen+recTrailerLen) || size > 1<<40 {
		return nil, fmt.Errorf("%s: %w: %d bytes", path, errRecFile, size)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, size-int64(sha256.Size+len(recEnd)))); err != nil {
		return nil, err
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	r := &recFile{data: data}
	if err := r.check(h.Sum(nil)); err != nil {
		r.close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// check checks the magic, the trailer's bounds and the checksum sum.
func (r *recFile) check(sum []byte) error {
	d := r.data
	t := d[len(d)-recTrailerLen:]
	if string(d[:len(recMagic)]) != recMagic || string(t[len(t)-len(recEnd):]) != recEnd {
		return fmt.Errorf("%w: bad magic", errRecFile)
	}
	if v := binary.LittleEndian.Uint32(d[len(recMagic):]); v != recFormat {
		return fmt.Errorf("%w: format %d", errRecFile, v)
	}
	if !bytes.Equal(t[24:24+sha256.Size], sum) {
		return fmt.Errorf("%w: checksum mismatch", errRecFile)
	}
	n, offsAt, packsAt := binary.LittleEndian.Uint64(t), binary.LittleEndian.Uint64(t[8:]), binary.LittleEndian.Uint64(t[16:])
	end := uint64(len(d) - recTrailerLen)
	if offsAt < uint64(recHeaderLen) || offsAt > end || n > (end-offsAt)/8 || offsAt+8*n != packsAt || packsAt > end {
		return fmt.Errorf("%w: bad trailer", errRecFile)
	}
	r.n, r.offsAt, r.packsAt = int(n), int(offsAt), int(packsAt)
	return nil
}

func (r *recFile) close() {
	if r != nil && r.data != nil {
		_ = unix.Munmap(r.data)
		r.data = nil
	}
}

// record returns record i's path and the bytes that follow it.
func (r *recFile) record(i int) (string, []byte, bool) {
	p, rest, ok := r.key(i)
	return string(p), rest, ok
}

// key returns record i's path, as mapped bytes, and the bytes that follow.
func (r *recFile) key(i int) ([]byte, []byte, bool) {
	off := binary.LittleEndian.Uint64(r.data[r.offsAt+8*i:])
	if off < uint64(recHeaderLen) || off >= uint64(r.offsAt) {
		return nil, nil, false
	}
	b := r.data[off:r.offsAt]
	l, k := binary.Uvarint(b)
	if k <= 0 || l > uint64(len(b)-k) {
		return nil, nil, false
	}
	return b[k : k+int(l)], b[k+int(l):], true
}

// find returns the record of path p.
func (r *recFile) find(p string) (Record, bool) {
	if r == nil {
		return Record{}, false
	}
	if r.finds.Add(1)%releaseFinds == 0 {
		// Lookups spread over the file (some twenty pages each); the
		// few pages every lookup reads come back on the next.
		r.release(0, len(r.data))
	}
	i := sort.Search(r.n, func(i int) bool {
		q, _, ok := r.key(i)
		return !ok || string(q) >= p // compared in place, not copied
	})
	if i == r.n {
		return Record{}, false
	}
	q, rest, ok := r.key(i)
	if !ok || string(q) != p {
		return Record{}, false
	}
	f, _, err := decodeRecord(rest)
	return f, err == nil
}

// each calls fn with every record in path order until fn returns false;
// a record that does not decode ends the walk.
func (r *recFile) each(fn func(p string, f Record) bool) {
	r.walk(func(key, rest []byte) bool {
		f, _, err := decodeRecord(rest)
		return err == nil && fn(string(key), f)
	})
}

// walk calls fn with every record's path (mapped bytes) and the bytes
// that follow it, in order, until fn returns false or a record is out of
// bounds.
func (r *recFile) walk(fn func(key, rest []byte) bool) {
	if r == nil {
		return
	}
	for i := range r.n {
		if i > 0 && i%releaseEvery == 0 {
			// Pages behind the walk are not read again: let them go, so
			// that a pass over a million records does not keep all of
			// them (some 90 MB) in the process's memory.
			off := int(binary.LittleEndian.Uint64(r.data[r.offsAt+8*i:]))
			r.release(recHeaderLen, min(off, r.offsAt))
			r.release(r.offsAt, r.offsAt+8*i)
		}
		key, rest, ok := r.key(i)
		if !ok || !fn(key, rest) {
			return
		}
	}
}

// releaseFinds is how many lookups find makes between releases of the
// whole mapping.
const releaseFinds = 512

// releaseEvery is how many records each walks between releases of the
// pages behind it.
const releaseEvery = 1 << 15

// release lets the pages wholly inside data[lo:hi] go from the process
// (they stay in the page cache, and are read again if touched).
func (r *recFile) release(lo, hi int) {
	pg := os.Getpagesize()
	lo = (lo + pg - 1) / pg * pg
	hi = hi / pg * pg
	if lo < hi {
		_ = unix.Madvise(r.data[lo:hi], unix.MADV_DONTNEED)
	}
}

// packs decodes the pack table.
func (r *recFile) packs() (map[string]layout.Chunk, error) {
	out := map[string]layout.Chunk{}
	if r == nil {
		return out, nil
	}
	b := r.data[r.packsAt : len(r.data)-recTrailerLen]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, errRecFile
	}
	b = b[k:]
	for range n {
		var key digest.Digest
		var ch layout.Chunk
		var err error
		if key, b, err = decodeDigest(b); err != nil {
			return nil, err
		}
		if ch, b, err = decodeChunk(b); err != nil {
			return nil, err
		}
		out[key.String()] = ch
	}
	return out, nil
}

// recWriter writes a record file; records must come sorted by path.
type recWriter struct {
	w    *bufio.Writer // to out and h
	out  io.Writer
	h    hash.Hash
	off  uint64
	offs []uint64
	last string
	buf  []byte
	err  error
}

func newRecWriter(w io.Writer) *recWriter {
	h := sha256.New()
	rw := &recWriter{w: bufio.NewWriterSize(io.MultiWriter(w, h), 1<<20), out: w, h: h}
	rw.put(append([]byte(recMagic), binary.LittleEndian.AppendUint32(nil, recFormat)...))
	return rw
}

func (rw *recWriter) put(b []byte) {
	if rw.err != nil {
		return
	}
	_, rw.err = rw.w.Write(b)
	rw.off += uint64(len(b))
}

// add writes the record of path p, which must sort after the one before.
func (rw *recWriter) add(p string, f Record) {
	if len(rw.offs) > 0 && p <= rw.last && rw.err == nil {
		rw.err = fmt.Errorf("layout: stat records out of order: %q after %q", p, rw.last)
	}
	rw.offs = append(rw.offs, rw.off)
	rw.last = p
	rw.buf = binary.AppendUvarint(rw.buf[:0], uint64(len(p)))
	rw.buf = append(rw.buf, p...)
	rw.buf = appendRecord(rw.buf, f)
	rw.put(rw.buf)
}

// finish writes the offsets, the packs and the trailer.
func (rw *recWriter) finish(packs map[string]layout.Chunk) error {
	offsAt := rw.off
	for _, o := range rw.offs {
		rw.put(binary.LittleEndian.AppendUint64(rw.buf[:0], o))
	}
	packsAt := rw.off
	keys := sortedKeys(packs)
	b := binary.AppendUvarint(nil, uint64(len(keys)))
	for _, k := range keys {
		b = appendDigest(b, digest.Digest(k))
		b = AppendChunk(b, packs[k])
	}
	rw.put(b)
	t := binary.LittleEndian.AppendUint64(nil, uint64(len(rw.offs)))
	t = binary.LittleEndian.AppendUint64(t, offsAt)
	t = binary.LittleEndian.AppendUint64(t, packsAt)
	rw.put(t)
	if rw.err != nil {
		return rw.err
	}
	if err := rw.w.Flush(); err != nil {
		return err
	}
	// The checksum covers every byte before it.
	_, err := rw.out.Write(append(rw.h.Sum(nil), recEnd...))
	return err
}

// appendRecord encodes f less its path.
func appendRecord(b []byte, f Record) []byte {
	b = binary.AppendUvarint(b, uint64(f.Stat.Size))
	b = binary.AppendVarint(b, f.Stat.Mtime)
	b = binary.AppendVarint(b, f.Stat.Ctime)
	b = binary.AppendUvarint(b, f.Stat.Ino)
	var flags byte
	if f.Unverified {
		flags |= recUnverified
	}
	if f.Racy {
		flags |= recRacy
	}
	if f.Chunks != nil {
		flags |= recChunks
	}
	if f.Extents != nil {
		flags |= recExtents
	}
	b = append(b, flags)
	b = appendDigest(b, f.Digest)
	if f.Chunks != nil {
		b = binary.AppendUvarint(b, uint64(len(f.Chunks)))
		for _, ch := range f.Chunks {
			b = AppendChunk(b, ch)
		}
	}
	if f.Extents != nil {
		b = binary.AppendUvarint(b, uint64(len(f.Extents)))
		for _, e := range f.Extents {
			b = appendDigest(b, e.Digest)
			b = binary.AppendUvarint(b, uint64(e.Length))
		}
	}
	return b
}

// decodeRecord decodes what appendRecord wrote.
func decodeRecord(b []byte) (Record, []byte, error) {
	var f Record
	var vals [4]uint64
	for i := range vals {
		var k int
		if i == 1 || i == 2 {
			var v int64
			v, k = binary.Varint(b)
			vals[i] = uint64(v)
		} else {
			vals[i], k = binary.Uvarint(b)
		}
		if k <= 0 {
			return f, nil, errRecFile
		}
		b = b[k:]
	}
	f.Stat = Key{Size: int64(vals[0]), Mtime: int64(vals[1]), Ctime: int64(vals[2]), Ino: vals[3]}
	if len(b) == 0 {
		return f, nil, errRecFile
	}
	flags := b[0]
	f.Unverified, f.Racy = flags&recUnverified != 0, flags&recRacy != 0
	var err error
	if f.Digest, b, err = decodeDigest(b[1:]); err != nil {
		return f, nil, err
	}
	if flags&recChunks != 0 {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)) {
			return f, nil, errRecFile
		}
		b = b[k:]
		f.Chunks = make([]layout.Chunk, n)
		for i := range f.Chunks {
			if f.Chunks[i], b, err = decodeChunk(b); err != nil {
				return f, nil, err
			}
		}
	}
	if flags&recExtents != 0 {
		if f.Extents, b, err = decodeExtents(b); err != nil {
			return f, nil, err
		}
	}
	return f, b, nil
}

func decodeExtents(b []byte) ([]pulledExtent, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, nil, errRecFile
	}
	b = b[k:]
	out := make([]pulledExtent, n)
	var err error
	for i := range out {
		if out[i].Digest, b, err = decodeDigest(b); err != nil {
			return nil, nil, err
		}
		l, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, nil, errRecFile
		}
		out[i].Length, b = int64(l), b[k:]
	}
	return out, b, nil
}

// AppendChunk appends ch as the records and the piece memo encode it.
func AppendChunk(b []byte, ch layout.Chunk) []byte {
	b = appendDigest(b, ch.Digest)
	b = binary.AppendUvarint(b, uint64(ch.Size))
	b = appendDigest(b, ch.Head)
	return appendDigest(b, ch.Tail)
}

func decodeChunk(b []byte) (layout.Chunk, []byte, error) {
	var ch layout.Chunk
	var err error
	if ch.Digest, b, err = decodeDigest(b); err != nil {
		return ch, nil, err
	}
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return ch, nil, errRecFile
	}
	ch.Size, b = int64(n), b[k:]
	if ch.Head, b, err = decodeDigest(b); err != nil {
		return ch, nil, err
	}
	ch.Tail, b, err = decodeDigest(b)
	return ch, b, err
}

// appendDigest encodes d: 0 for none, 1 and 32 bytes for a SHA-256, 2
// and a length-prefixed string for any other.
func appendDigest(b []byte, d digest.Digest) []byte {
	if d == "" {
		return append(b, 0)
	}
	if enc, ok := strings.CutPrefix(string(d), "sha256:"); ok && len(enc) == 2*sha256.Size {
		if raw, err := hex.DecodeString(enc); err == nil && hex.EncodeToString(raw) == enc {
			return append(append(b, 1), raw...)
		}
	}
	b = append(b, 2)
	b = binary.AppendUvarint(b, uint64(len(d)))
	return append(b, d...)
}

func decodeDigest(b []byte) (digest.Digest, []byte, error) {
	if len(b) == 0 {
		return "", nil, errRecFile
	}
	switch b[0] {
	case 0:
		return "", b[1:], nil
	case 1:
		if len(b) < 1+sha256.Size {
			return "", nil, errRecFile
		}
		return layout.SHA256Digest((*[sha256.Size]byte)(b[1 : 1+sha256.Size])), b[1+sha256.Size:], nil
	case 2:
		n, k := binary.Uvarint(b[1:])
		if k <= 0 || n > uint64(len(b)-1-k) {
			return "", nil, errRecFile
		}
		return digest.Digest(b[1+k : 1+k+int(n)]), b[1+k+int(n):], nil
	}
	return "", nil, errRecFile
}
