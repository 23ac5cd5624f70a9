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
// The head of the order (its first headChunks*Jobs*splitMin bytes) is what
// a reader starting now waits for first: its large chunks come as range
// requests (when the source serves ranges), Jobs/2 to a chunk and two
// chunks at a time, so that they arrive in order, each in a fraction of
// the time one request takes, and the next chunk's requests are on the
// link while the one before is verified and stored; its small chunks and
// the rest of the order follow whole, Jobs at a time. A load gives back
// its place on the link as soon as its chunk is cached, before its bytes
// go into the page cache (replayLoaded).
func (v *Volume) LoadChunks(ctx context.Context, ks []int) error {
	jobs := int64(v.opt.Jobs)
	sem := semaphore.NewWeighted(jobs) // a request in flight takes 1
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	fail := func(err error) { once.Do(func() { first = err }) }
	n := v.ver.NumChunks()
	budget := headChunks * jobs * splitMin
	parts := max(min(jobs, 2), jobs/headChunks) // range requests per head chunk
	for _, k := range ks {
		if k < 0 || k >= n {
			continue
		}
		size := v.ver.Chunk(k).Size
		head := budget > 0 && size >= splitMin && parts > 1
		budget -= size
		w := int64(1)
		if head {
			w = parts
		}
		if err := sem.Acquire(ctx, w); err != nil {
			break
		}
		wg.Go(func() {
			if head {
				h, err := v.load(ctx, k, int(parts))
				sem.Release(w)
				if err != nil {
					fail(err)
					return
				}
				v.release(h)
				v.replayLoaded(k)
				return
			}
			fctx, cancel := v.fetchContext(ctx)
			ch, err := v.opt.Cache.Load(fctx, v.src, v.ver.Chunk(k))
			cancel()
			sem.Release(w)
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

// headChunks is how many chunks of a replay's head are fetched at once,
// each as Jobs/headChunks range requests.
const headChunks = 2

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
