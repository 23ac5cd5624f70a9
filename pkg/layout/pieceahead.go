package layout

import (
	"context"
	"errors"
	"sync"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// Bounds of the index pieces Open fetches ahead of checking them: at most
// piecesAhead fetched and not yet taken, each at most pieceAheadBytes (a
// larger piece, and every piece after it, is fetched when its turn comes).
const (
	piecesAhead     = 8
	pieceAheadBytes = 4 << 20
)

// errNotAhead says a piece was not fetched ahead; the caller fetches it.
var errNotAhead = errors.New("piece not fetched ahead")

// pieceAhead fetches, in the background and in parallel, the index piece
// layers that follow a version 2 top-level index in its manifest (and the
// delta table that follows them in version 3 and 4), so that
// opening a version costs the round trips of the manifest and of the
// top-level index and pieces together, not one after another. Each piece
// is verified against its layer's descriptor as it is fetched; match still
// checks that descriptor against the top-level index before using it.
type pieceAhead struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	slots  []*pieceSlot
	next   int
	tokens chan struct{}
}

// pieceSlot is one piece fetched ahead: done is closed once b or err is set.
type pieceSlot struct {
	desc ocispec.Descriptor
	done chan struct{}
	b    []byte
	err  error
}

// startPieces starts fetching the piece layers of first; nil (which takes
// nothing) when first does not start with a version 2 index.
func startPieces(ctx context.Context, src content.Fetcher, first *manifestOrIndex) *pieceAhead {
	if first == nil || first.NumLayers < 2 || (first.First.MediaType != MediaTypeIndexV2 && first.First.MediaType != MediaTypeIndexV3 && first.First.MediaType != MediaTypeIndexV4) {
		return nil
	}
	a := &pieceAhead{tokens: make(chan struct{}, piecesAhead)}
	_ = first.eachLayer(func(l layer) error {
		if l.i == 0 {
			return nil
		}
		d := l.desc()
		if (d.MediaType != MediaTypePiece && d.MediaType != MediaTypeDeltas) || d.Size <= 0 || d.Size > pieceAheadBytes {
			return errNotAhead // the pieces come first; stop at the first that is not one
		}
		a.slots = append(a.slots, &pieceSlot{desc: d, done: make(chan struct{})})
		if d.MediaType == MediaTypeDeltas {
			return errNotAhead // the delta table follows the pieces: the last one ahead
		}
		return nil
	})
	if len(a.slots) == 0 {
		return nil
	}
	ctx, a.cancel = context.WithCancel(ctx)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for i, s := range a.slots {
			select {
			case a.tokens <- struct{}{}:
			case <-ctx.Done():
				for _, r := range a.slots[i:] { // not started: none is fetching
					r.err = ctx.Err()
					close(r.done)
				}
				return
			}
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				s.b, s.err = fetchAll(ctx, src, s.desc)
				close(s.done)
			}()
		}
	}()
	return a
}

// take returns the bytes of piece layer d, verified, when it is the next
// piece fetched ahead, waiting for its fetch; errNotAhead when it is not.
func (a *pieceAhead) take(ctx context.Context, d ocispec.Descriptor) ([]byte, error) {
	if a == nil || a.next >= len(a.slots) {
		return nil, errNotAhead
	}
	s := a.slots[a.next]
	if s.desc.Digest != d.Digest || s.desc.Size != d.Size {
		return nil, errNotAhead
	}
	a.next++
	select {
	case <-s.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	b, err := s.b, s.err
	s.b = nil
	<-a.tokens // a later piece may start
	return b, err
}

// stop cancels the fetches not yet done and waits for them.
func (a *pieceAhead) stop() {
	if a == nil {
		return
	}
	a.cancel()
	a.wg.Wait()
}
