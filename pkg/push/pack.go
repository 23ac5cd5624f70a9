package push

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"io"
	"iter"
	"math/bits"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// edgeHasher hashes the head and tail edges of a chunk of known size as
// its bytes go by.
type edgeHasher struct {
	size, pos  int64
	head, tail hash.Hash
}

func newEdgeHasher(size int64) *edgeHasher {
	return &edgeHasher{size: size, head: sha256.New(), tail: sha256.New()}
}

func (e *edgeHasher) Write(p []byte) {
	end := e.pos + int64(len(p))
	if e.pos < layout.EdgeBytes {
		e.head.Write(p[:min(int64(len(p)), layout.EdgeBytes-e.pos)])
	}
	if from := e.size - layout.EdgeBytes; end > from {
		e.tail.Write(p[max(0, from-e.pos):])
	}
	e.pos = end
}

// set records the edges in ch when it is large enough to carry them.
func (e *edgeHasher) set(ch *layout.Chunk) {
	if ch.Size >= layout.EdgeMinChunk {
		ch.Head = digest.NewDigest(digest.SHA256, e.head)
		ch.Tail = digest.NewDigest(digest.SHA256, e.tail)
	}
}

// packMember is a small file in the pack being filled.
type packMember struct {
	idx  int
	size int64
	dg   digest.Digest
	data []byte // nil when its digest is known (stat cache, stated by the source)
}

// allRead tells whether every member's bytes are in memory.
func allRead(ms []packMember) bool {
	for _, m := range ms {
		if m.data == nil {
			return false
		}
	}
	return true
}

// packSmall packs the files smaller than the minimum chunk size, in path
// order, into chunks whose ends are chosen by the files' own digests, so an
// added or changed file changes only the pack around it.
func (b *builder) packSmall(ctx context.Context, submit func(chunkJob) error) error {
	p := b.opt.Params.PackParams()
	limit := b.opt.Params.Min // files under it are packed
	var threshold uint64 = ^uint64(0)
	if p.Avg > p.Min {
		threshold = ^uint64(0) / uint64(p.Avg-p.Min)
	}
	var (
		members []packMember
		size    int64
	)
	closePack := func() error {
		if len(members) == 0 {
			return nil
		}
		key := sha256.New()
		for _, m := range members {
			fmt.Fprintf(key, "%s %d\n", m.dg, m.size)
		}
		keyStr := digest.NewDigest(digest.SHA256, key).String()
		ch, ok := b.opt.Cache.Pack(keyStr)
		if !ok || ch.Size != size {
			ch, ok = b.previousPack(members, size)
		}
		if !ok {
			h := sha256.New()
			edges := newEdgeHasher(size)
			for k, m := range members {
				if m.data == nil {
					data, err := b.readSmall(ctx, b.entries.path(m.idx), m.size)
					if err != nil {
						return err
					}
					if verify.Bytes(b.entries.path(m.idx), data, ocispec.Descriptor{Digest: m.dg, Size: m.size}) != nil {
						return fmt.Errorf("%s: %w", b.entries.path(m.idx), ErrFileChanged)
					}
					if b.buffer != nil {
						members[k].data = data // a remote source's pack is uploaded from memory
					}
					m.data = data
				}
				h.Write(m.data)
				edges.Write(m.data)
			}
			ch = layout.Chunk{Digest: digest.NewDigest(digest.SHA256, h), Size: size}
			edges.set(&ch)
			b.opt.Cache.StorePack(keyStr, ch)
		}
		job := chunkJob{Chunk: ch, src: make([]section, len(members))}
		if b.buffer == nil || allRead(members) {
			if err := b.holdPack(ctx, &job, func(yield func([]byte) bool) {
				for _, m := range members {
					if !yield(m.data) {
						return
					}
				}
			}); err != nil {
				return err
			}
		}
		var off int64
		pc := &ch                               // shared by the pack's files
		exts := make([]extentRef, len(members)) // one allocation for the pack
		for k, m := range members {
			job.src[k] = section{b.entries.path(m.idx), 0, m.size}
			exts[k] = extentRef{chunk: pc, off: off, length: m.size}
			sum, err := fileSum(b.entries.path(m.idx), m.dg)
			if err != nil {
				return err
			}
			b.results[m.idx] = fileChunks{sum: sum, extents: exts[k : k+1 : k+1]}
			off += m.size
		}
		members, size = members[:0], 0
		return b.emit(submit, job)
	}
	err := b.readSmallAhead(ctx, limit, func(sf *smallFile) error {
		i, e := sf.idx, b.entries.at(sf.idx)
		m := packMember{idx: i, size: e.Size, dg: sf.dg, data: sf.data}
		b.opt.Counters.Processed.Add(e.Size)
		if e.Size == 0 {
			sum, err := fileSum(e.Path, m.dg)
			if err != nil {
				return err
			}
			b.results[i] = fileChunks{sum: sum}
			return nil
		}
		if size > 0 && size+e.Size > p.Max {
			if err := closePack(); err != nil {
				return err
			}
		}
		members = append(members, m)
		size += e.Size
		if size >= p.Min {
			hi, lo := bits.Mul64(uint64(e.Size), threshold)
			if hi > 0 || binary.BigEndian.Uint64(mustHex(m.dg)) < lo {
				return closePack()
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return closePack()
}

func mustHex(d digest.Digest) []byte {
	var out [8]byte
	enc := d.Encoded()
	for i := 0; i < 8 && 2*i+1 < len(enc); i++ {
		out[i] = unhex(enc[2*i])<<4 | unhex(enc[2*i+1])
	}
	return out[:]
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return 0
}

// readSmall reads a whole small file and checks its size.
func (b *builder) readSmall(ctx context.Context, path string, size int64) ([]byte, error) {
	f, err := b.src.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data := make([]byte, size+1)
	n, err := f.ReadAt(data, 0)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(n) != size {
		return nil, fmt.Errorf("%s: %w (size %d, read %d)", path, ErrFileChanged, size, n)
	}
	return data[:n], nil
}

// holdPack gives job the bytes of its members (data, in order) to upload
// from: always for a remote source, and for a local one when every member
// was read (not known from the stat cache) and packHeld has room.
func (b *builder) holdPack(ctx context.Context, job *chunkJob, data iter.Seq[[]byte]) error {
	sem := b.buffer
	if sem == nil {
		if b.packHeld == nil || b.collect {
			return nil
		}
		for d := range data {
			if d == nil {
				return nil
			}
		}
		sem, job.held = b.packHeld, b.packHeld
	}
	if err := sem.Acquire(ctx, min(job.Size, bufferBudget)); err != nil {
		return err
	}
	job.data = make([]byte, 0, job.Size)
	for d := range data {
		job.data = append(job.data, d...)
	}
	return nil
}
