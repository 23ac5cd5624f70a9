package oci

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"

	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// The OCI-layout target refuses wrong bytes with verify's error, on push
// and when a stored manifest no longer matches its digest.
func TestLayoutMismatchIsVerifyError(t *testing.T) {
	ctx := context.Background()
	dir, md, _ := newLayout(t)
	s, err := openLayout(ctx, dir, true)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("the right bytes")
	desc := content.NewDescriptorFromBytes("application/octet-stream", data)
	err = s.Push(ctx, desc, bytes.NewReader([]byte("the wrong bytes")))
	var ve *verify.Error
	if !errors.As(err, &ve) || !errors.Is(err, verify.ErrDigestMismatch) || ve.Want != desc.Digest {
		t.Fatalf("push of wrong bytes: %v, want verify's error for %s", err, desc.Digest)
	}
	p, err := s.blobPath(md.Digest)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.fetchManifest(md); !errors.As(err, &ve) || ve.Want != md.Digest || ve.What != "manifest" {
		t.Fatalf("changed manifest: %v, want verify's error for manifest %s", err, md.Digest)
	}
}
