package replicate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

// referrerRegistry is go-containerregistry's registry behind a handler
// that speaks the OCI referrers API: every manifest, the ones it made
// included (unless flat), has fanout fresh referrers (made on request,
// each a manifest whose subject is the one asked about), up to limit of
// them in all. It counts the GETs of each manifest.
type referrerRegistry struct {
	inner         http.Handler
	fanout, limit int
	flat          bool

	mu    sync.Mutex
	made  map[digest.Digest][]byte
	gets  map[string]int
	total int
}

func newReferrerRegistry(t *testing.T, fanout, limit int) (*referrerRegistry, string) {
	r := &referrerRegistry{inner: ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0))), fanout: fanout, limit: limit,
		made: map[digest.Digest][]byte{}, gets: map[string]int{}}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return r, strings.TrimPrefix(srv.URL, "http://")
}

func (r *referrerRegistry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	parts := strings.Split(req.URL.Path, "/")
	n := len(parts)
	if n >= 4 && parts[n-2] == "referrers" && req.Method == http.MethodGet {
		r.referrers(w, digest.Digest(parts[n-1]))
		return
	}
	if n >= 4 && parts[n-2] == "manifests" {
		r.mu.Lock()
		if req.Method == http.MethodGet {
			r.gets[parts[n-1]]++
		}
		b, ok := r.made[digest.Digest(parts[n-1])]
		r.mu.Unlock()
		if ok {
			w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
			w.Header().Set("Docker-Content-Digest", parts[n-1])
			w.Header().Set("Content-Length", fmt.Sprint(len(b)))
			if req.Method == http.MethodGet {
				w.Write(b)
			}
			return
		}
	}
	r.inner.ServeHTTP(w, req)
}

// referrers answers the referrers of subject: fanout fresh manifests.
func (r *referrerRegistry) referrers(w http.ResponseWriter, subject digest.Digest) {
	idx := ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{}}
	r.mu.Lock()
	_, isMade := r.made[subject]
	for i := 0; i < r.fanout && r.total < r.limit && !(r.flat && isMade); i++ {
		r.total++
		m := ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
			ArtifactType: "application/x-chain", Config: ocispec.DescriptorEmptyJSON, Layers: []ocispec.Descriptor{ocispec.DescriptorEmptyJSON},
			Subject:     &ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: subject, Size: 2},
			Annotations: map[string]string{"n": fmt.Sprint(r.total)}}
		b, _ := json.Marshal(m)
		d := digest.FromBytes(b)
		r.made[d] = b
		idx.Manifests = append(idx.Manifests, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: d, Size: int64(len(b)), ArtifactType: m.ArtifactType})
	}
	r.mu.Unlock()
	w.Header().Set("Content-Type", ocispec.MediaTypeImageIndex)
	json.NewEncoder(w).Encode(idx)
}

// made returns how many referrers the registry made.
func (r *referrerRegistry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

// pushImage writes a random image to ref.
func pushImage(t *testing.T, ref string) {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := name.ParseReference(ref)
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
}

// A registry that answers every manifest with a fresh referrer (a chain
// without end) fails the copy once referrers nest MaxReferrerDepth deep;
// one that answers with many fails it at MaxManifests.
// Neither leaves a tag at the destination.
func TestCopyBoundsReferrers(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		fanout, limit int
		flat          bool
		max           int
		want          string
	}{
		{"chain", 1, 200, false, 0, "nest more than 4 deep"},
		{"many", 200, 200, true, 50, "more than 50 manifests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg, src := newReferrerRegistry(t, tc.fanout, tc.limit)
			reg.flat = tc.flat
			pushImage(t, src+"/a:v1")
			dst := registryHost(t)
			_, err := Copy(ctx, side(t, src+"/a:v1"), side(t, dst+"/b"), Options{Referrers: true, MaxManifests: tc.max})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("copy with %d referrers made: %v; want %q", reg.count(), err, tc.want)
			}
			t.Logf("%s: %v (%d referrers made)", tc.name, err, reg.count())
			if tags, _ := remote.List(mustRepo(t, dst+"/b")); len(tags) != 0 {
				t.Errorf("the refused copy tagged %v", tags)
			}
		})
	}
}

func mustRepo(t *testing.T, s string) name.Repository {
	t.Helper()
	r, err := name.NewRepository(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A manifest whose layer claims 2^62 bytes is refused before any blob is
// sent; a lower MaxBlobBytes refuses a real layer above it.
func TestCopyBoundsBlobSizes(t *testing.T) {
	ctx := context.Background()
	src, dst := registryHost(t), registryHost(t)
	layer := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.FromString("huge"), Size: 1 << 62}
	cfg := []byte("{}")
	m, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cfg), Size: 2},
		Layers: []ocispec.Descriptor{layer}})
	s := side(t, src+"/a")
	md := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(m), Size: int64(len(m))}
	if err := s.Target.Push(ctx, md, strings.NewReader(string(m))); err != nil {
		t.Fatal(err)
	}
	if err := s.Target.Tag(ctx, md, "huge"); err != nil {
		t.Fatal(err)
	}
	_, err := Copy(ctx, side(t, src+"/a:huge"), side(t, dst+"/b"), Options{})
	if !errors.Is(err, errdef.ErrSizeExceedsLimit) || !strings.Contains(err.Error(), "claims 4611686018427387904 bytes") {
		t.Fatalf("copy of a 2^62-byte layer: %v", err)
	}
	pushImage(t, src+"/a:small")
	_, err = Copy(ctx, side(t, src+"/a:small"), side(t, dst+"/b"), Options{MaxBlobBytes: 100})
	if !errors.Is(err, errdef.ErrSizeExceedsLimit) {
		t.Fatalf("copy of a 256-byte layer with MaxBlobBytes 100: %v", err)
	}
	if tags, _ := remote.List(mustRepo(t, dst+"/b")); len(tags) != 0 {
		t.Errorf("the refused copies tagged %v", tags)
	}
}

// The manifests of a copy past maxHeldManifestBytes are not kept in memory
// until pushed but read again from the source, and verified again: an
// index of manifests larger than the budget copies whole, and the source
// served those manifests twice.
func TestCopyHoldsBoundedManifestBytes(t *testing.T) {
	defer func(n int64) { maxHeldManifestBytes = n }(maxHeldManifestBytes)
	maxHeldManifestBytes = 1 << 20
	ctx := context.Background()
	reg, src := newReferrerRegistry(t, 0, 0)
	dst := registryHost(t)
	s := side(t, src+"/a")
	cfg := []byte("{}")
	cfgDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(cfg), Size: 2}
	if err := s.Target.Push(ctx, cfgDesc, strings.NewReader("{}")); err != nil {
		t.Fatal(err)
	}
	var children []ocispec.Descriptor
	for i := range 5 {
		pad := strings.Repeat(fmt.Sprintf("%x", testutil.RandBytes(uint64(i), 200<<10)), 1)
		m, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
			Config: cfgDesc, Layers: []ocispec.Descriptor{}, Annotations: map[string]string{"pad": pad}})
		d := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(m), Size: int64(len(m))}
		if err := s.Target.Push(ctx, d, strings.NewReader(string(m))); err != nil {
			t.Fatal(err)
		}
		children = append(children, d)
	}
	idx, _ := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: children})
	id := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: digest.FromBytes(idx), Size: int64(len(idx))}
	if err := s.Target.Push(ctx, id, strings.NewReader(string(idx))); err != nil {
		t.Fatal(err)
	}
	if err := s.Target.Tag(ctx, id, "big"); err != nil {
		t.Fatal(err)
	}
	rep, err := Copy(ctx, side(t, src+"/a:big"), side(t, dst+"/b"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.ManifestsSent != 6 {
		t.Errorf("%d manifests sent, want 6", rep.ManifestsSent)
	}
	for _, d := range append(children, id) {
		r, _ := name.ParseReference(dst + "/b@" + d.Digest.String())
		if got, err := remote.Head(r); err != nil || got.Size != d.Size {
			t.Errorf("manifest %s at the destination: %v, %v", d.Digest, got, err)
		}
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	again := 0
	for _, c := range children {
		if reg.gets[c.Digest.String()] >= 2 {
			again++
		}
	}
	// About 410 KB each against a 1 MiB budget: two are held, three read again.
	if again != 3 {
		t.Errorf("%d of the 5 manifests were read twice from the source, want 3: %v", again, reg.gets)
	}
}
