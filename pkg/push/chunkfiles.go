package push

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/internal/sha2x"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// chunkAll chunks every regular file: large files in parallel, small files
// packed in path order by one goroutine.
func (b *builder) chunkAll(ctx context.Context, submit func(chunkJob) error) error {
	g, ctx := errgroup.WithContext(ctx)
	large := make(chan int)
	workers := max(1, runtime.GOMAXPROCS(0))
	for range workers {
		g.Go(func() error {
			buf := make([]byte, 1<<20)
			for i := range large {
				if err := b.chunkFile(ctx, i, buf, submit); err != nil {
					return err
				}
			}
			return nil
		})
	}
	g.Go(func() error { return b.packSmall(ctx, submit) })
	g.Go(func() error {
		defer close(large)
		for i := range b.entries.len() {
			e := b.entries.at(i)
			if e.Type != layout.TypeFile || e.Size < b.opt.Params.Min {
				continue
			}
			select {
			case large <- i:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	return g.Wait()
}

// known records entry i as the file of digest d cut into chunks, without
// reading it, and hands each chunk to submit: the uploader reads it from
// the source only if the destination lacks it.
func (b *builder) known(i int, d digest.Digest, chunks []layout.Chunk, submit func(chunkJob) error) error {
	e := b.entries.at(i)
	var off int64
	sum, err := fileSum(e.Path, d)
	if err != nil {
		return err
	}
	res := fileChunks{sum: sum, extents: make([]extentRef, 0, len(chunks))}
	for k, ch := range chunks {
		if err := b.emit(submit, chunkJob{Chunk: ch, src: []section{{e.Path, off, ch.Size}}}); err != nil {
			return err
		}
		res.extents = append(res.extents, extentRef{chunk: &chunks[k], length: ch.Size})
		off += ch.Size
	}
	b.results[i] = res
	b.opt.Counters.Processed.Add(e.Size)
	return nil
}

// chunkFile cuts one large file into chunks and hands each to submit.
func (b *builder) chunkFile(ctx context.Context, i int, buf []byte, submit func(chunkJob) error) error {
	e := b.entries.at(i)
	if chunks, ok := b.previousChunks(e); ok {
		return b.known(i, e.Digest, chunks, submit)
	}
	if c, ok := b.opt.Cache.Lookup(e.Path, e.Stat); ok && c.Chunks != nil && b.buffer == nil {
		return b.known(i, c.Digest, c.Chunks, submit)
	}
	ra, err := b.src.Open(ctx, e.Path)
	if err != nil {
		return err
	}
	defer ra.Close()
	fc := &fileCut{b: b, path: e.Path, ra: ra, submit: submit, cdc: true,
		sums: sha2x.New(), cut: layout.NewCutter(b.opt.Params)}
	if cuts, ok := layout.FormatCuts(ra, e.Path, e.Size, b.opt.Params); ok {
		// The header says where every tensor is: cut there, and at
		// fixed offsets inside big tensors, with no rolling hash.
		fc.cuts, fc.cdc = cuts, false
	}
	if mapped, err := b.feedMapped(ctx, fc, ra, e.Path, e.Size); mapped {
		if err != nil {
			return err
		}
		return b.cutDone(ctx, i, fc, e.Path, e.Size)
	}
	f := io.NewSectionReader(ra, 0, e.Size+1) // one byte more shows growth
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := io.ReadFull(f, buf)
		if n > 0 {
			if err := fc.feed(ctx, buf[:n]); err != nil {
				return err
			}
			b.opt.Counters.Processed.Add(int64(n))
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("read %s: %w", e.Path, rerr)
		}
	}
	return b.cutDone(ctx, i, fc, e.Path, e.Size)
}

// cutDone ends the cut of entry i once its size bytes were fed.
func (b *builder) cutDone(ctx context.Context, i int, fc *fileCut, path string, size int64) error {
	if fc.pos != size {
		return fmt.Errorf("%s: %w (size %d, read %d)", path, ErrFileChanged, size, fc.pos)
	}
	if err := fc.emit(ctx); err != nil {
		return err
	}
	res := fc.res
	fc.sums.SumA(res.sum[:0])
	b.results[i] = res
	if b.read != nil {
		b.read[i] = true // its stat record: b.freshRecords
	}
	return nil
}

// fileCut is one large file being cut into chunks as its bytes are read.
//
// Each byte is hashed twice, for its chunk and for the file, in one pass
// (sha2x: the two SHA-256 computations interleaved), and a chunk's head
// edge digest is the chunk's state after EdgeBytes, so it is not hashed
// again.
type fileCut struct {
	b      *builder
	path   string
	ra     ReadAtCloser
	submit func(chunkJob) error
	cuts   []int64 // forced cut offsets (tensor boundaries), ascending
	cdc    bool    // cut by content where no forced cut is due

	sums       *sha2x.Pair   // A: the file's SHA-256; B: the current chunk's
	head       digest.Digest // of the current chunk, once it has EdgeBytes
	cut        *layout.Cutter
	pos, start int64 // bytes read; where the current chunk starts
	res        fileChunks
	held       []byte // the current chunk's bytes, for remote sources
}

// feed hashes data, the file's next bytes, and emits each chunk that ends
// in it.
func (fc *fileCut) feed(ctx context.Context, data []byte) error {
	for len(data) > 0 {
		lim := len(data)
		forced := false
		for len(fc.cuts) > 0 && fc.cuts[0] <= fc.pos {
			fc.cuts = fc.cuts[1:]
		}
		if len(fc.cuts) > 0 && fc.cuts[0]-fc.pos <= int64(lim) {
			lim = int(fc.cuts[0] - fc.pos)
			forced = true
		}
		k, end := lim, false
		if fc.cdc {
			k, end = fc.cut.Next(data[:lim])
		}
		fc.hash(data[:k])
		if fc.b.buffer != nil {
			fc.held = append(fc.held, data[:k]...)
		}
		fc.pos += int64(k)
		data = data[k:]
		if end || (forced && k == lim) {
			if err := fc.emit(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// hash adds p, bytes of the current chunk, to the file's and the chunk's
// hashes, and takes the head edge's digest where the chunk reaches
// EdgeBytes.
func (fc *fileCut) hash(p []byte) {
	in := fc.pos - fc.start
	if in >= layout.EdgeBytes || in+int64(len(p)) < layout.EdgeBytes {
		fc.sums.Write(p)
		return
	}
	h := int(layout.EdgeBytes - in)
	fc.sums.Write(p[:h])
	fc.head = digest.NewDigestFromBytes(digest.SHA256, fc.sums.SumB(nil))
	fc.sums.Write(p[h:])
}

// emit ends the current chunk (if it has bytes) and hands it on.
func (fc *fileCut) emit(ctx context.Context) error {
	n := fc.pos - fc.start
	if n == 0 {
		return nil
	}
	ch := layout.Chunk{Digest: digest.NewDigestFromBytes(digest.SHA256, fc.sums.SumB(nil)), Size: n}
	fc.sums.ResetB()
	if n >= layout.EdgeMinChunk {
		ch.Head = fc.head
		tail, err := fc.tail(n)
		if err != nil {
			return err
		}
		ch.Tail = digest.FromBytes(tail[len(tail)-layout.EdgeBytes:])
	}
	fc.head = ""
	fc.cut.Reset()
	fc.res.extents = append(fc.res.extents, extentRef{chunk: &ch, length: n})
	job := chunkJob{Chunk: ch, src: []section{{fc.path, fc.start, n}}}
	if fc.b.buffer != nil {
		if err := fc.b.buffer.Acquire(ctx, min(n, bufferBudget)); err != nil {
			return err
		}
		job.data, fc.held = fc.held, nil
	}
	err := fc.b.emit(fc.submit, job)
	fc.start = fc.pos
	return err
}

// tail returns bytes ending the current chunk of n bytes, at least
// EdgeBytes of them: the chunk held, or its last EdgeBytes read again.
func (fc *fileCut) tail(n int64) ([]byte, error) {
	if fc.held != nil {
		return fc.held, nil
	}
	tail := make([]byte, layout.EdgeBytes)
	k, err := fc.ra.ReadAt(tail, fc.start+n-layout.EdgeBytes)
	switch {
	case err == io.EOF && k == len(tail):
	case err == io.EOF:
		return nil, fmt.Errorf("%s: %w", fc.path, ErrFileChanged)
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", fc.path, err)
	}
	return tail, nil
}

// feedMapped feeds a local file's size bytes to fc from read-only
// mappings of it, a window at a time, so they are hashed where the page
// cache holds them, not copied into a buffer first (and the process maps
// at most one window of each file). mapped is false, and nothing fed,
// when ra cannot be mapped; a file cut short meanwhile (a fault on the
// mapping) or grown is ErrFileChanged.
func (b *builder) feedMapped(ctx context.Context, fc *fileCut, ra ReadAtCloser, path string, size int64) (mapped bool, err error) {
	f, ok := ra.(*os.File)
	if !ok || b.buffer != nil || size <= 0 {
		return false, nil
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return false, nil
	}
	for off := int64(0); off < size; off += mapWindow {
		if err := ctx.Err(); err != nil {
			return off > 0, err
		}
		var m []byte
		var merr error
		if err := sc.Control(func(fd uintptr) {
			m, merr = unix.Mmap(int(fd), off, int(min(mapWindow, size-off)), unix.PROT_READ, unix.MAP_SHARED)
		}); err != nil || merr != nil {
			if off == 0 {
				return false, nil // not mappable: read it
			}
			return true, fmt.Errorf("map %s: %w", path, errors.Join(err, merr))
		}
		err := b.feedWindow(ctx, fc, m, path)
		unix.Munmap(m)
		if err != nil {
			return true, err
		}
	}
	if fi, err := f.Stat(); err != nil {
		return true, err
	} else if fi.Size() != size {
		return true, fmt.Errorf("%s: %w (size %d, now %d)", path, ErrFileChanged, size, fi.Size())
	}
	return true, nil
}

// mapWindow is how much of a file feedMapped maps at once.
const mapWindow = 16 << 20

// feedWindow feeds the mapped bytes m to fc, a fault on them (the file cut
// short) returned as ErrFileChanged.
func (b *builder) feedWindow(ctx context.Context, fc *fileCut, m []byte, path string) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(interface{ Addr() uintptr }); !ok {
				panic(r)
			}
			err = fmt.Errorf("%s: %w (it was cut short while read)", path, ErrFileChanged)
		}
	}()
	_ = unix.Madvise(m, unix.MADV_SEQUENTIAL)
	const step = 1 << 20
	for off := 0; off < len(m); off += step {
		p := m[off:min(off+step, len(m))]
		if err := fc.feed(ctx, p); err != nil {
			return err
		}
		b.opt.Counters.Processed.Add(int64(len(p)))
	}
	return nil
}
