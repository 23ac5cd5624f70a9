package lazy

import "context"

// fetchContext bounds ctx by one fetch's timeout (Options.FetchTimeout), if
// the volume has one. Call cancel when the fetch is done.
func (v *Volume) fetchContext(ctx context.Context) (_ context.Context, cancel context.CancelFunc) {
	if v.opt.FetchTimeout > 0 {
		return context.WithTimeout(ctx, v.opt.FetchTimeout)
	}
	return ctx, func() {}
}
