package signature

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// blobCounter counts the registry's blob GETs by digest and samples the
// test process's heap at each request.
type blobCounter struct {
	h http.Handler

	mu       sync.Mutex
	gets     map[string]int
	peakHeap uint64
}

func (c *blobCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
		c.gets[r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]]++
	}
	c.sampleLocked()
	c.mu.Unlock()
	c.h.ServeHTTP(w, r)
}

// sampleLocked records the heap in use if it is the largest seen.
func (c *blobCounter) sampleLocked() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	c.peakHeap = max(c.peakHeap, ms.HeapAlloc)
}

// hostileRegistry is go-containerregistry's registry (with the referrers
// API) holding a version and n signature referrers of it, each listing
// layers entries that all name one 64 KiB payload blob, with signatures
// that verify with no key.
func hostileRegistry(t *testing.T, n, layers int) (oci.Target, ocispec.Descriptor, *blobCounter, ocispec.Descriptor) {
	t.Helper()
	ctx := context.Background()
	bc := &blobCounter{h: ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)), ggcr.WithReferrersSupport(true)), gets: map[string]int{}}
	srv := httptest.NewServer(bc)
	t.Cleanup(srv.Close)
	ref, err := oci.ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/hostile:v1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(ctx, ref, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	v := pushEmptyVersion(t, ctx, tg)
	// A payload naming v, padded to the largest size a payload may have.
	var p payload
	p.Critical.Identity.DockerReference = "vol/hostile"
	p.Critical.Image.DockerManifestDigest = v.Digest.String()
	p.Critical.Type = cosignType
	p.Optional = map[string]any{"pad": ""}
	b, _ := json.Marshal(p)
	p.Optional["pad"] = strings.Repeat("x", maxPayload-len(b))
	pb, _ := json.Marshal(p)
	if len(pb) != maxPayload {
		t.Fatalf("payload of %d bytes", len(pb))
	}
	pd := content.NewDescriptorFromBytes(MediaTypeSimpleSigning, pb)
	if err := pushIfMissing(ctx, tg, pd, pb); err != nil {
		t.Fatal(err)
	}
	cfgDesc := content.NewDescriptorFromBytes(ArtifactTypeSignature, []byte("{}"))
	if err := pushIfMissing(ctx, tg, cfgDesc, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 71)
	for i := 0; i < n; i++ {
		ls := make([]ocispec.Descriptor, layers)
		for j := range ls {
			rand.Read(sig)
			ls[j] = pd
			ls[j].Annotations = map[string]string{AnnotationSignature: base64.StdEncoding.EncodeToString(sig), AnnotationKeyID: fmt.Sprintf("%064x", i)}
		}
		mb, _ := json.Marshal(ocispec.Manifest{
			Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
			ArtifactType: ArtifactTypeSignature, Config: cfgDesc, Layers: ls,
			Subject: &ocispec.Descriptor{MediaType: v.MediaType, Digest: v.Digest, Size: v.Size},
		})
		md := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, mb)
		if err := pushIfMissing(ctx, tg, md, mb); err != nil {
			t.Fatal(err)
		}
	}
	bc.gets, bc.peakHeap = map[string]int{}, 0
	return tg, v, bc, pd
}

// TestVerifyBoundedHostileReferrers: a version whose registry lists many
// signature referrers, each with many entries naming the same 64 KiB
// payload, costs one fetch of that payload and little memory, and a valid
// signature by tag is found without reading the referrers.
func TestVerifyBoundedHostileReferrers(t *testing.T) {
	ctx := context.Background()
	a, _ := newKey(t, t.TempDir(), "a")
	va := []Verifier{a.Verifier()}
	const referrers, layers = 16, 256
	tg, v, bc, pd := hostileRegistry(t, referrers, layers)

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	_, err := Verify(ctx, tg, v, va)
	if !errors.Is(err, ErrOtherKey) {
		t.Fatalf("verify: %v; want %v", err, ErrOtherKey)
	}
	bc.mu.Lock()
	bc.sampleLocked()
	fetches, growth := bc.gets[pd.Digest.String()], int64(bc.peakHeap)-int64(base)
	bc.mu.Unlock()
	t.Logf("%d referrers of %d entries each naming one %d-byte payload: %d fetches of it, heap growth %d MiB",
		referrers, layers, pd.Size, fetches, growth>>20)
	if fetches != 1 {
		t.Errorf("the payload was fetched %d times, want once", fetches)
	}
	if growth > 16<<20 {
		t.Errorf("heap grew by %d MiB during the verification, want at most 16", growth>>20)
	}
	if len(err.Error()) > 1024 {
		t.Errorf("refusal of %d bytes: %.300s...", len(err.Error()), err)
	}

	// With a valid signature by tag, no referrer and no other payload is read.
	e, err := Sign(ctx, tg, "vol/hostile", v, a)
	if err != nil {
		t.Fatal(err)
	}
	bc.mu.Lock()
	bc.gets = map[string]int{}
	bc.mu.Unlock()
	got, err := Verify(ctx, tg, v, va)
	if err != nil || got.Entry.Referrer {
		t.Fatalf("verify with a valid signature: %+v, %v", got, err)
	}
	bc.mu.Lock()
	defer bc.mu.Unlock()
	if bc.gets[pd.Digest.String()] != 0 || len(bc.gets) != 1 || bc.gets[digest.FromBytes(e.Payload).String()] != 1 {
		t.Errorf("blob GETs verifying a valid tag signature: %v; want its payload's only", bc.gets)
	}
}

// TestVerifyBounds: at most maxSigManifests signature manifests and
// maxSigEntries entries of each are read; the refusal says so.
func TestVerifyBounds(t *testing.T) {
	ctx := context.Background()
	a, _ := newKey(t, t.TempDir(), "a")
	tg, v, _, _ := hostileRegistry(t, maxSigManifests+6, maxSigEntries+5)
	_, err := Verify(ctx, tg, v, []Verifier{a.Verifier()})
	if !errors.Is(err, ErrOtherKey) || !strings.Contains(err.Error(), fmt.Sprintf("%d signatures", maxSigManifests*maxSigEntries)) ||
		!strings.Contains(err.Error(), "not read") {
		t.Fatalf("verify: %v", err)
	}
	es, err := Find(ctx, tg, v)
	if err != nil || len(es) != maxSigManifests*maxSigEntries {
		t.Fatalf("find: %d entries (%v), want %d", len(es), err, maxSigManifests*maxSigEntries)
	}
}

// TestVerifyRefusesEndlessReferrerPages: a registry whose referrers API
// offers pages of other artifacts for ever (the signature filter empties
// every page) stops the verification within oci.MaxReferrerPages pages
// with oci.ErrListTooLong.
func TestVerifyRefusesEndlessReferrerPages(t *testing.T) {
	ctx := context.Background()
	reg := ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)), ggcr.WithReferrersSupport(true))
	var pages atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/referrers/") {
			reg.ServeHTTP(w, r)
			return
		}
		n := pages.Add(1)
		ds := []ocispec.Descriptor{{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: "application/example",
			Digest: digest.FromString(fmt.Sprint(n)), Size: 100}}
		if n < 5_000 {
			w.Header().Set("Link", fmt.Sprintf(`<%s?page=%d>; rel="next"`, r.URL.Path, n))
		}
		w.Header().Set("Content-Type", ocispec.MediaTypeImageIndex)
		json.NewEncoder(w).Encode(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: ds})
	}))
	defer srv.Close()
	ref, err := oci.ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/endless:v1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(ctx, ref, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	v := pushEmptyVersion(t, ctx, tg)
	a, _ := newKey(t, t.TempDir(), "a")
	_, err = Verify(ctx, tg, v, []Verifier{a.Verifier()})
	if !errors.Is(err, oci.ErrListTooLong) {
		t.Fatalf("verify: %v; want %v", err, oci.ErrListTooLong)
	}
	if n := pages.Load(); n > oci.MaxReferrerPages {
		t.Fatalf("%d referrer pages read, want at most %d", n, oci.MaxReferrerPages)
	}
}

// pushEmptyVersion pushes a manifest of no layers to tg and returns it: the
// version the hostile registries' signatures name.
func pushEmptyVersion(t *testing.T, ctx context.Context, tg oci.Target) ocispec.Descriptor {
	t.Helper()
	vb := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[]}`)
	v := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, vb)
	if err := pushIfMissing(ctx, tg, ocispec.DescriptorEmptyJSON, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := pushIfMissing(ctx, tg, v, vb); err != nil {
		t.Fatal(err)
	}
	return v
}
