package lazy

import (
	"context"
	"sync"

	"golang.org/x/sync/errgroup"
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
func (v *Volume) LoadChunks(ctx context.Context, ks []int) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(v.opt.Jobs)
	var once sync.Once
	var first error
	n := v.ver.NumChunks()
	for _, k := range ks {
		if k < 0 || k >= n {
			continue
		}
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			fctx, cancel := v.fetchContext(gctx)
			defer cancel()
			ch, err := v.opt.Cache.Load(fctx, v.src, v.ver.Chunk(k))
			if err != nil {
				once.Do(func() { first = err })
				return nil
			}
			return ch.Close()
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
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
