package versions

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// boundedFetcher fails every fetch after max of them.
type boundedFetcher struct {
	content.Fetcher
	n, max int64
}

func (b *boundedFetcher) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	if atomic.AddInt64(&b.n, 1) > b.max {
		return nil, fmt.Errorf("fetch %d of %s: too many fetches", b.n, d.Digest)
	}
	return b.Fetcher.Fetch(ctx, d)
}

// TestCompareHostileManifests: a root manifest with a "manifests" field
// that nests 2^20 fetches deep is refused by what layout.Open checks;
// Compare never follows it.
func TestCompareHostileManifests(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	vs := threeVersions(t, tg)
	push := func(mediaType string, b []byte) ocispec.Descriptor {
		d := content.NewDescriptorFromBytes(mediaType, b)
		if err := tg.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	// x_k lists x_{k-1} twice: following it fetches 2^k blobs.
	x := push("application/json", []byte(`{}`))
	for range 20 {
		b, _ := json.Marshal(map[string]any{"manifests": []ocispec.Descriptor{x, x}})
		x = push("application/json", b)
	}
	var root map[string]any
	if err := json.Unmarshal(vs[0].RootBytes, &root); err != nil {
		t.Fatal(err)
	}
	root["manifests"] = []ocispec.Descriptor{x, x}
	rb, _ := json.Marshal(root)
	rd := push(ocispec.MediaTypeImageManifest, rb)

	src := &boundedFetcher{Fetcher: tg, max: 1000}
	_, err := Compare(ctx, Located{src, vs[1].Root}, Located{src, rd})
	if !errors.Is(err, layout.ErrInvalidIndex) {
		t.Fatalf("compare: %v, want layout.ErrInvalidIndex", err)
	}
	if src.n > 20 {
		t.Errorf("%d fetches for two versions", src.n)
	}
}
