package replicate

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"oras.land/oras-go/v2/registry/remote/credentials"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// registryHost starts go-containerregistry's in-memory registry.
func registryHost(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func side(t *testing.T, ref string) Side {
	t.Helper()
	r, err := oci.ParseRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(context.Background(), r, oci.Options{Credentials: credentials.NewMemoryStore(), CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	return Side{Ref: r, Target: tg}
}

// Any OCI graph copies whole: an image index of images, each with a config
// and layers, keeps its digest, validates at the destination (every
// manifest and blob there, with the digests the index names), and a second
// copy sends nothing.
func TestCopyAnIndexOfImages(t *testing.T) {
	ctx := context.Background()
	src, dst := registryHost(t), registryHost(t)
	idx, err := random.Index(1024, 3, 4)
	if err != nil {
		t.Fatal(err)
	}
	srcRef, _ := name.ParseReference(src + "/a/b:multi")
	if err := remote.WriteIndex(srcRef, idx); err != nil {
		t.Fatal(err)
	}
	want, _ := idx.Digest()

	rep, err := Copy(ctx, side(t, src+"/a/b:multi"), side(t, dst+"/c"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Digest.String() != want.String() || rep.Manifests != 5 || rep.BlobsSent != 4*(3+1) || rep.BlobsSkipped != 0 {
		t.Fatalf("copy: %+v; want digest %s, 5 manifests, 16 blobs sent", rep, want)
	}
	dstRef, _ := name.ParseReference(dst + "/c:multi")
	got, err := remote.Index(dstRef)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(got); err != nil {
		t.Fatalf("the copy does not validate: %v", err)
	}
	if d, _ := got.Digest(); d != want {
		t.Fatalf("the copy's tag points at %s, want %s", d, want)
	}

	again, err := Copy(ctx, side(t, src+"/a/b:multi"), side(t, dst+"/c"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if again.BlobsSent != 0 || again.BytesSent != 0 || again.ManifestsSent != 0 || again.BlobsSkipped != 16 {
		t.Fatalf("second copy: %+v; want everything skipped", again)
	}

	// Into an OCI layout and out again, to a third registry.
	lay := "oci:" + t.TempDir() + "/l"
	if _, err := Copy(ctx, side(t, dst+"/c:multi"), side(t, lay), Options{}); err != nil {
		t.Fatal(err)
	}
	third := registryHost(t)
	back, err := Copy(ctx, side(t, lay+":multi"), side(t, third+"/d"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	r3, _ := name.ParseReference(third + "/d:multi")
	got3, err := remote.Index(r3)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(got3); err != nil || back.Digest.String() != want.String() {
		t.Fatalf("registry -> layout -> registry: %v, digest %s, want %s", err, back.Digest, want)
	}
}
