package push

import (
	"context"
	"sync"

	"github.com/opencontainers/go-digest"
	"golang.org/x/sync/semaphore"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// smallFile is a small file of the push, as packSmall takes it in path
// order: its digest, and its bytes unless the stat cache knew the digest.
type smallFile struct {
	idx  int
	dg   digest.Digest
	data []byte
	err  error
	done chan struct{}
}

// Bounds of the small files read ahead of packing: open files (readers)
// and bytes held.
const (
	smallReaders = 16
	smallAhead   = 32 << 20
)

// readSmallAhead reads the small files (entries under limit) with
// smallReaders at a time, at most smallAhead bytes ahead of the packer,
// and calls fn with each in path order; it stops at fn's first error.
func (b *builder) readSmallAhead(ctx context.Context, limit int64, fn func(*smallFile) error) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	jobs := make(chan *smallFile)
	order := make(chan *smallFile, 1024)
	ahead := semaphore.NewWeighted(smallAhead)
	for range smallReaders {
		wg.Go(func() {
			for f := range jobs {
				b.readSmallFile(ctx, f)
				close(f.done)
			}
		})
	}
	wg.Go(func() {
		defer close(order)
		defer close(jobs)
		for i := range b.entries.len() {
			e := b.entries.at(i)
			if e.Type != layout.TypeFile || e.Size >= limit {
				continue
			}
			if ahead.Acquire(ctx, min(e.Size, smallAhead)) != nil {
				return
			}
			f := &smallFile{idx: i, done: make(chan struct{})}
			select {
			case order <- f:
			case <-ctx.Done():
				return
			}
			select {
			case jobs <- f:
			case <-ctx.Done():
				return
			}
		}
	})
	for f := range order {
		select {
		case <-f.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		ahead.Release(min(b.entries.size[f.idx], smallAhead))
		if f.err != nil {
			return f.err
		}
		if err := fn(f); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// readSmallFile takes f's digest from the stat cache, or reads and hashes
// it (and records it there).
func (b *builder) readSmallFile(ctx context.Context, f *smallFile) {
	e := b.entries.at(f.idx)
	if c, ok := b.opt.Cache.Lookup(e.Path, e.Stat); ok && b.buffer == nil {
		f.dg = c.Digest
		return
	}
	if e.Digest != "" && b.opt.Previous != nil {
		f.dg = e.Digest // stated: read only if no pack of the previous version holds it
		return
	}
	data, err := b.readSmall(ctx, e.Path, e.Size)
	if err != nil {
		f.err = err
		return
	}
	f.dg, f.data = digest.FromBytes(data), data
	if b.read != nil {
		b.read[f.idx] = true // its stat record: b.freshRecords
	}
}
