package lazy

import (
	"context"
	"io"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// checkedSource serves every blob as bytes a decoder verified.
type checkedSource []byte

func (b checkedSource) Fetch(_ context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	return verify.NewChecked(b, desc, nil), nil
}

// TestCountedKeepsChecked: the volume's counting of its fetches passes on
// that a body is bytes a decoder verified (a delta chunk), so that the
// cache stores them without hashing them again.
func TestCountedKeepsChecked(t *testing.T) {
	b := []byte("a decoded chunk")
	desc := ocispec.Descriptor{Digest: digest.FromBytes(b), Size: int64(len(b))}
	v := &Volume{}
	rc, err := v.counted(checkedSource(b)).Fetch(context.Background(), desc)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if ck := verify.CheckedOf(rc); !ck.Vouches(desc) {
		t.Fatalf("the counted body (%T) does not pass on the verified bytes", rc)
	}
}
