package lazy

import (
	"context"
	"errors"
	"fmt"
	"io"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// rangeSource is a source that can also fetch part of a blob, as the
// registry and OCI-layout targets of package oci can.
type rangeSource interface {
	content.Fetcher
	oci.RangeFetcher
}

// Edges: the first and last layout.EdgeBytes of a large chunk have their
// own digests in the index. The kernel reads whole pages, so a read of a
// tensor also reads the page it shares with each neighbouring tensor; those
// few bytes come from the neighbours' edges, fetched by range and verified,
// instead of from their whole (up to 16 MiB) chunks.

// maxEdges bounds the edges a Volume keeps in memory.
const maxEdges = 64

// maxEdgeFailures is how many edges in a row may fail verification before
// a Volume stops fetching edges; a source that cannot serve ranges at all
// stops them at once.
const maxEdgeFailures = 3

// errEdgeMismatch is an edge whose bytes do not match its digest; the
// errors that wrap it also wrap verify's *Error (layout.ErrDigestMismatch).
var errEdgeMismatch = errors.New("edge digest mismatch")

type edgeKey struct {
	chunk int
	tail  bool
}

type edgeCall struct {
	done chan struct{}
	data []byte
	err  error
}

// edge returns the verified edge of chunk k that holds the chunk bytes
// [lo, hi), and the chunk offset of its first byte, when the range lies in
// an edge and the chunk is neither loaded nor being loaded. Otherwise, or
// when the edge cannot be fetched, ok is false and the caller loads the
// whole chunk.
func (v *Volume) edge(ctx context.Context, k int, lo, hi int64) (data []byte, base int64, ok bool) {
	c := v.ver.Index.Chunk(k)
	tail, ok := v.edgeFor(k, c, lo, hi)
	if !ok {
		return nil, 0, false
	}
	key := edgeKey{k, tail}
	v.mu.Lock()
	call, found := v.edges[key]
	if !found {
		if len(v.edges) >= maxEdges {
			v.dropOneEdge()
		}
		call = &edgeCall{done: make(chan struct{})}
		v.edges[key] = call
		v.mu.Unlock()
		call.data, call.err = v.fetchEdge(ctx, k, c, tail)
		if call.err != nil {
			v.mu.Lock()
			delete(v.edges, key)
			v.mu.Unlock()
		}
		close(call.done)
	} else {
		v.mu.Unlock()
		select {
		case <-call.done:
		case <-ctx.Done():
			return nil, 0, false
		}
	}
	if call.err != nil {
		return nil, 0, false
	}
	if tail {
		base = c.Size - layout.EdgeBytes
	}
	return call.data, base, true
}

// dropOneEdge forgets one fetched edge, making room for another. Called
// with v.mu held.
func (v *Volume) dropOneEdge() {
	for key, call := range v.edges {
		select {
		case <-call.done:
			delete(v.edges, key)
			return
		default:
		}
	}
}

// edgeFor reports which edge of chunk k holds [lo, hi), when an edge fetch
// is the way to read it.
func (v *Volume) edgeFor(k int, c layout.Chunk, lo, hi int64) (tail, ok bool) {
	if !c.HasEdges() || v.edgeFailures.Load() >= maxEdgeFailures {
		return false, false
	}
	if d, ok := v.ver.Index.Delta(k); ok && v.opt.Cache.Has(d.Base) {
		// Decoded whole over the base the cache holds: no edge, whose
		// delta blob would be fetched twice.
		return false, false
	}
	if _, ok := v.src.(rangeSource); !ok {
		return false, false
	}
	switch {
	case hi <= layout.EdgeBytes:
	case lo >= c.Size-layout.EdgeBytes:
		tail = true
	default:
		return false, false
	}
	v.mu.Lock()
	_, open := v.handles[k]
	pending := v.pending[k]
	v.mu.Unlock()
	if open || pending || v.opt.Cache.Has(c.Digest) {
		return false, false
	}
	return tail, true
}

// edgeAhead fetches in the background the edge of chunk k holding [lo, hi),
// if edge() would read that range from an edge. It reports whether it did.
func (v *Volume) edgeAhead(k int, lo, hi int64) bool {
	if _, ok := v.edgeFor(k, v.ver.Index.Chunk(k), lo, hi); !ok {
		return false
	}
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		v.edge(v.bg, k, lo, hi)
	}()
	return true
}

// fetchEdge fetches an edge of chunk k by range and verifies it.
func (v *Volume) fetchEdge(ctx context.Context, k int, c layout.Chunk, tail bool) ([]byte, error) {
	ctx, cancel := v.fetchContext(ctx)
	defer cancel()
	off, want := int64(0), c.Head
	if tail {
		off, want = c.Size-layout.EdgeBytes, c.Tail
	}
	data, err := func() ([]byte, error) {
		rc, err := v.src.(rangeSource).FetchRange(ctx, v.ver.Chunk(k), off, layout.EdgeBytes)
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		buf := make([]byte, layout.EdgeBytes)
		if _, err := io.ReadFull(rc, buf); err != nil {
			return nil, err
		}
		edge := ocispec.Descriptor{Digest: want, Size: layout.EdgeBytes}
		if err := verify.Bytes(fmt.Sprintf("edge at %d of chunk %s", off, c.Digest), buf, edge); err != nil {
			return nil, fmt.Errorf("%w: %w", errEdgeMismatch, err)
		}
		return buf, nil
	}()
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		v.edgeFailures.Store(maxEdgeFailures) // no ranges from this source
		return nil, err
	case errors.Is(err, errEdgeMismatch):
		v.edgeFailures.Add(1)
		return nil, err
	case err != nil:
		return nil, err // unreachable source: the whole chunk fails too
	}
	v.edgeFailures.Store(0)
	v.rangesOK.Store(true) // split fetches need not probe
	return data, nil
}
