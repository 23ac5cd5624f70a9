package layout

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"runtime"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/errgroup"
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
		for i, e := range b.entries {
			if e.Type != TypeFile || e.Size < b.opt.Params.Min {
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
func (b *builder) known(i int, d digest.Digest, chunks []Chunk, submit func(chunkJob) error) error {
	e := b.entries[i]
	var off int64
	res := fileChunks{digest: d}
	for _, ch := range chunks {
		if err := b.emit(submit, chunkJob{Chunk: ch, src: []section{{e.Path, off, ch.Size}}}); err != nil {
			return err
		}
		res.extents = append(res.extents, extentRef{chunk: ch, length: ch.Size})
		off += ch.Size
	}
	b.results[i] = res
	b.opt.Counters.Processed.Add(e.Size)
	return nil
}

// chunkFile cuts one large file into chunks and hands each to submit.
func (b *builder) chunkFile(ctx context.Context, i int, buf []byte, submit func(chunkJob) error) error {
	e := b.entries[i]
	path := e.Path
	if chunks, ok := b.previousChunks(e); ok {
		return b.known(i, e.Digest, chunks, submit)
	}
	if c, ok := b.opt.Cache.Lookup(e.Path, e.Stat); ok && c.Chunks != nil && b.buffer == nil {
		return b.known(i, c.Digest, c.Chunks, submit)
	}
	ra, err := b.src.Open(ctx, path)
	if err != nil {
		return err
	}
	defer ra.Close()
	f := io.NewSectionReader(ra, 0, e.Size+1) // one byte more shows growth
	var cuts []int64
	cdc := true
	if IsSafetensors(e.Path) {
		if hdrEnd, ts, err := ReadSafetensorsHeader(ra, e.Size); err == nil {
			// The header says where every tensor is: cut there, and
			// at fixed offsets inside big tensors, with no rolling hash.
			cuts = tensorBoundaries(hdrEnd, ts, e.Size, b.opt.Params)
			cdc = false
		}
	}
	// Each byte is hashed twice, for its chunk and for the file; the
	// file's hash starts as a copy of its first chunk's state (the same
	// bytes from the same start), and a chunk's head edge digest is the
	// chunk's state after EdgeBytes, so neither is hashed again.
	var fileHash hash.Hash // nil until the first chunk ends
	chunkHash := sha256.New()
	var head digest.Digest // of the current chunk, once it has EdgeBytes
	cut := newCutter(b.opt.Params)
	var (
		pos, start int64
		res        fileChunks
		held       []byte // the current chunk's bytes, for remote sources
	)
	emitChunk := func() error {
		n := pos - start
		if n == 0 {
			return nil
		}
		if fileHash == nil {
			h, err := cloneHash(chunkHash)
			if err != nil {
				return err
			}
			fileHash = h
		}
		ch := Chunk{Digest: digest.NewDigest(digest.SHA256, chunkHash), Size: n}
		chunkHash.Reset()
		if n >= EdgeMinChunk {
			ch.Head = head
			tail := held
			if tail == nil {
				tail = make([]byte, EdgeBytes)
				k, err := ra.ReadAt(tail, start+n-EdgeBytes)
				switch {
				case err == io.EOF && k == len(tail):
				case err == io.EOF:
					return fmt.Errorf("%s: %w", path, ErrFileChanged)
				case err != nil:
					return fmt.Errorf("read %s: %w", path, err)
				}
			}
			ch.Tail = digest.FromBytes(tail[len(tail)-EdgeBytes:])
		}
		head = ""
		cut.reset()
		res.extents = append(res.extents, extentRef{chunk: ch, length: n})
		job := chunkJob{Chunk: ch, src: []section{{path, start, n}}}
		if b.buffer != nil {
			if err := b.buffer.Acquire(ctx, min(n, bufferBudget)); err != nil {
				return err
			}
			job.data, held = held, nil
		}
		err := b.emit(submit, job)
		start = pos
		return err
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := io.ReadFull(f, buf)
		if n > 0 {
			data := buf[:n]
			for len(data) > 0 {
				lim := len(data)
				forced := false
				for len(cuts) > 0 && cuts[0] <= pos {
					cuts = cuts[1:]
				}
				if len(cuts) > 0 && cuts[0]-pos <= int64(lim) {
					lim = int(cuts[0] - pos)
					forced = true
				}
				k, end := lim, false
				if cdc {
					k, end = cut.next(data[:lim])
				}
				if fileHash != nil {
					fileHash.Write(data[:k])
				}
				if in := pos - start; in < EdgeBytes && in+int64(k) >= EdgeBytes {
					// The chunk reaches EdgeBytes in this piece: its state
					// there is the head edge's digest.
					h := int(EdgeBytes - in)
					chunkHash.Write(data[:h])
					hh, err := cloneHash(chunkHash)
					if err != nil {
						return err
					}
					head = digest.NewDigest(digest.SHA256, hh)
					chunkHash.Write(data[h:k])
				} else {
					chunkHash.Write(data[:k])
				}
				if b.buffer != nil {
					held = append(held, data[:k]...)
				}
				pos += int64(k)
				data = data[k:]
				if end || (forced && k == lim) {
					if err := emitChunk(); err != nil {
						return err
					}
				}
			}
			b.opt.Counters.Processed.Add(int64(n))
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("read %s: %w", path, rerr)
		}
	}
	if pos != e.Size {
		return fmt.Errorf("%s: %w (size %d, read %d)", path, ErrFileChanged, e.Size, pos)
	}
	if err := emitChunk(); err != nil {
		return err
	}
	res.digest = digest.NewDigest(digest.SHA256, fileHash)
	b.results[i] = res
	chunks := make([]Chunk, len(res.extents))
	for k, x := range res.extents {
		chunks[k] = x.chunk
	}
	b.opt.Cache.store(e.Path, CachedFile{Stat: e.Stat, Digest: res.digest, Chunks: chunks})
	return nil
}

// cloneHash returns a copy of h's state.
func cloneHash(h hash.Hash) (hash.Hash, error) {
	c, ok := h.(hash.Cloner)
	if !ok {
		return nil, fmt.Errorf("layout: %T cannot be cloned", h)
	}
	return c.Clone()
}
