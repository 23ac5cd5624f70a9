package chunkcache

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// bodyFetcher answers every fetch with the same body.
type bodyFetcher []byte

func (b bodyFetcher) Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b)), nil
}

// Load refuses a body that is short, long or other bytes with one error: a
// *ChunkInvalidError for the chunk, wrapping layout.ErrDigestMismatch. The
// bytes are neither returned nor stored, and the cache counts them corrupt.
func TestLoadRefusesWrongBodies(t *testing.T) {
	data := randBytes(7, 100_000)
	desc := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: digest.FromBytes(data), Size: int64(len(data))}
	other := append([]byte(nil), data...)
	other[len(other)/2] ^= 1
	for _, tc := range []struct {
		name string
		body []byte
		read int64
		got  digest.Digest
	}{
		{"short", data[:len(data)-1], desc.Size - 1, ""},
		{"long", append(append([]byte(nil), data...), 'x'), desc.Size + 1, ""},
		{"other bytes", other, desc.Size, digest.FromBytes(other)},
	} {
		c, err := Open(t.TempDir(), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := c.Load(context.Background(), bodyFetcher(tc.body), desc)
		var ce *ChunkInvalidError
		if ch != nil || !errors.As(err, &ce) || !errors.Is(err, layout.ErrDigestMismatch) {
			t.Fatalf("%s: Load = %v, %v; want no chunk and a ChunkInvalidError", tc.name, ch, err)
		}
		if ce.Want != desc.Digest || ce.Size != desc.Size || ce.Read != tc.read || ce.Got != tc.got {
			t.Errorf("%s: error %+v, want digest %s, size %d, read %d, got %q", tc.name, ce, desc.Digest, desc.Size, tc.read, tc.got)
		}
		if c.Contains(desc.Digest) || c.Stats().Corrupt != 1 {
			t.Errorf("%s: stored %v, stats %+v; want nothing stored and one corrupt", tc.name, c.Contains(desc.Digest), c.Stats())
		}
		// The right bytes are then fetched and kept.
		ch, err = c.Load(context.Background(), bodyFetcher(data), desc)
		if err != nil {
			t.Fatalf("%s: load of the right bytes: %v", tc.name, err)
		}
		ch.Close()
	}
}

// refetchFetcher streams half of a blob, then fails with a *RefetchError
// naming next (a peer that went away part-way).
type refetchFetcher struct {
	body []byte
	src  bodyFetcher
}

func (f refetchFetcher) Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error) {
	return io.NopCloser(io.MultiReader(bytes.NewReader(f.body[:len(f.body)/2]),
		errReader{&RefetchError{Next: f.src, Err: errors.New("peer went away")}})), nil
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// A source whose reader fails part-way with a *RefetchError costs a fetch
// from its Next, not a failed load: the bytes read so far are dropped and
// the blob is stored whole from the next source.
func TestLoadRefetchesFromNext(t *testing.T) {
	data := randBytes(9, 300_000)
	desc := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: digest.FromBytes(data), Size: int64(len(data))}
	c, err := Open(t.TempDir(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := c.Load(context.Background(), refetchFetcher{body: data, src: bodyFetcher(data)}, desc)
	if err != nil {
		t.Fatalf("a source that asks for a refetch: %v", err)
	}
	got := make([]byte, desc.Size)
	if _, err := ch.ReadAt(got, 0); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	ch.Close()
	if !bytes.Equal(got, data) || !c.Contains(desc.Digest) {
		t.Errorf("the refetched blob: right bytes %v, stored %v; want both", bytes.Equal(got, data), c.Contains(desc.Digest))
	}
}
