package lazy

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"
)

// noteRead tells Options.OnRead of the chunks of the extents from first on
// that a read ending at end touches.
func (f *File) noteRead(first int, end int64) {
	on := f.v.opt.OnRead
	if on == nil {
		return
	}
	for k := first; k < len(f.starts) && f.starts[k] < end; k++ {
		on(f.e.Extents[k].Chunk)
	}
}

// LoadChunks fills the cache with the chunks ks (indices into the
// version's chunks), started in that order with Jobs in flight, each
// verified like any read's. Chunks already cached cost nothing; a read
// that needs a chunk being loaded waits for that load. It returns the
// first error after trying every chunk.
//
// The head of the order (its first Jobs*splitMin bytes) is what a reader
// starting now waits for first: its large chunks come one after another,
// each as Jobs range requests (when the source serves ranges), so that
// the first arrives in a fraction of the time one request takes and a
// reader is not left waiting on a single request's rate; its small chunks
// and the rest of the order follow whole, Jobs at a time.
func (v *Volume) LoadChunks(ctx context.Context, ks []int) error {
	jobs := int64(v.opt.Jobs)
	sem := semaphore.NewWeighted(jobs) // a request in flight takes 1
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	fail := func(err error) { once.Do(func() { first = err }) }
	n := v.ver.NumChunks()
	budget := jobs * splitMin
	for _, k := range ks {
		if k < 0 || k >= n {
			continue
		}
		size := v.ver.Chunk(k).Size
		head := budget > 0 && size >= splitMin
		budget -= size
		if head {
			// Jobs range requests: wait for the link to be ours.
			if err := sem.Acquire(ctx, jobs); err != nil {
				break
			}
			h, err := v.load(ctx, k, v.opt.Jobs)
			sem.Release(jobs)
			if err != nil {
				fail(err)
				continue
			}
			v.release(h)
			v.replayLoaded(k)
			continue
		}
		if err := sem.Acquire(ctx, 1); err != nil {
			break
		}
		wg.Go(func() {
			defer sem.Release(1)
			fctx, cancel := v.fetchContext(ctx)
			defer cancel()
			ch, err := v.opt.Cache.Load(fctx, v.src, v.ver.Chunk(k))
			if err != nil {
				fail(err)
				return
			}
			ch.Close()
			v.replayLoaded(k)
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// Go runs fn in the background for the volume's lifetime: its context is
// cancelled by Close, which waits for fn to return.
func (v *Volume) Go(fn func(ctx context.Context)) {
	v.mu.Lock()
	if v.bg.Err() != nil {
		v.mu.Unlock()
		return
	}
	v.wg.Add(1)
	v.mu.Unlock()
	go func() {
		defer v.wg.Done()
		fn(v.bg)
	}()
}
