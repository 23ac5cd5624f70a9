package mounts

import "context"

// Wait blocks until every mount of all is gone or ctx is done, telling
// gone (if not nil) of each mount that went away. It reports whether some
// are still served.
func Wait(ctx context.Context, all []*Served, gone func(*Served)) bool {
	ended := make(chan *Served, len(all))
	for _, s := range all {
		go func() { <-s.Done(); ended <- s }()
	}
	for left := len(all); left > 0; left-- {
		select {
		case s := <-ended:
			if gone != nil {
				gone(s)
			}
		case <-ctx.Done():
			return true
		}
	}
	return false
}

// UnmountAll unmounts the mounts of all that are still served, telling
// unmounted (if not nil) of each; it stops at the first failure.
func UnmountAll(all []*Served, unmounted func(*Served)) error {
	for _, s := range all {
		select {
		case <-s.Done():
		default:
			if err := s.Unmount(); err != nil {
				return err
			}
			if unmounted != nil {
				unmounted(s)
			}
		}
	}
	return nil
}
