package replicate

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// reader returns a streamReader of body, which must be desc's blob.
func reader(body []byte, desc ocispec.Descriptor) *streamReader {
	rc := io.NopCloser(bytes.NewReader(body))
	return &streamReader{rc: rc, v: verify.Reader(rc, "blob", desc), src: "test"}
}

func TestStreamReaderPassesARightBlob(t *testing.T) {
	body := bytes.Repeat([]byte("bdnvol"), 100000)
	desc := ocispec.Descriptor{Digest: digest.FromBytes(body), Size: int64(len(body))}
	got, err := io.ReadAll(reader(body, desc))
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("read %d of %d bytes, err %v", len(got), len(body), err)
	}
}

// A body that does not match its digest never reaches its full size, so a
// destination given it as a request body of desc.Size bytes never gets a
// whole body, whether or not it checks the digest itself.
func TestStreamReaderWithholdsTheEndOfAWrongBlob(t *testing.T) {
	body := bytes.Repeat([]byte("bdnvol"), 100000)
	desc := ocispec.Descriptor{Digest: digest.FromBytes(body), Size: int64(len(body))}
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"flipped first byte", append([]byte{body[0] ^ 1}, body[1:]...)},
		{"flipped last byte", append(append([]byte{}, body[:len(body)-1]...), body[len(body)-1]^1)},
		{"one byte more", append(append([]byte{}, body...), 'x')},
		{"one byte short", body[:len(body)-1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := reader(tc.body, desc)
			var got bytes.Buffer
			n, err := io.CopyBuffer(&got, r, make([]byte, 1<<10))
			if n >= desc.Size || err == nil || !errors.Is(err, verify.ErrDigestMismatch) {
				t.Fatalf("passed on %d of %d bytes, err %v; want fewer than all and a digest mismatch", n, desc.Size, err)
			}
			if ferr := r.failure(); !errors.Is(ferr, verify.ErrDigestMismatch) {
				t.Fatalf("failure() = %v, want the digest mismatch", ferr)
			}
		})
	}
}
