package imageview

import (
	"context"
	"errors"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// TestExportRefusesDigestDestination: a destination with a digest is
// refused before anything is read.
func TestExportRefusesDigestDestination(t *testing.T) {
	dst, err := oci.ParseRef("reg.example/img@sha256:" + strings.Repeat("a", 64))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Export(context.Background(), nil, oci.Ref{}, ocispec.Descriptor{}, 0, dst, oci.Options{}, Options{}); !errors.Is(err, ErrDestinationDigest) {
		t.Fatalf("err %v, want ErrDestinationDigest", err)
	}
}
