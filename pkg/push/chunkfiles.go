package push

import (
	"context"
	"fmt"
	"io"
	"runtime"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/errgroup"

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
	if fc.pos != e.Size {
		return fmt.Errorf("%s: %w (size %d, read %d)", e.Path, ErrFileChanged, e.Size, fc.pos)
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
