package profile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
)

func dg(s string) digest.Digest { return digest.FromString(s) }

// version pushes a small tree of several chunks into t (a memory store
// when nil) and opens it.
func version(t *testing.T, seed uint64) *layout.Version {
	t.Helper()
	dir := t.TempDir()
	testutil.WriteTree(t, dir, map[string][]byte{
		"a.bin": testutil.RandBytes(seed, 300<<10),
		"b.bin": testutil.RandBytes(seed+1, 200<<10),
	})
	store := memory.New()
	res, err := push.Push(context.Background(), store, push.DirSource(dir), push.Options{Params: layout.Params{Min: 4 << 10, Avg: 16 << 10, Max: 64 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := layout.Open(context.Background(), store, res.Root)
	if err != nil {
		t.Fatal(err)
	}
	if v.NumChunks() < 8 {
		t.Fatalf("%d chunks, want several", v.NumChunks())
	}
	return v
}

func TestEncodeIsDeterministicAndRoundTrips(t *testing.T) {
	p := New(dg("v"), []digest.Digest{dg("c2"), dg("c1"), dg("c3")})
	a, b := p.Encode(), New(dg("v"), []digest.Digest{dg("c2"), dg("c1"), dg("c3")}).Encode()
	if !bytes.Equal(a, b) {
		t.Fatalf("two encodings differ:\n%s\n%s", a, b)
	}
	got, err := Parse(a)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != p.Version || fmt.Sprint(got.Chunks) != fmt.Sprint(p.Chunks) {
		t.Fatalf("round trip: %+v, want %+v", got, p)
	}
	// Only the media type, the version and the chunks: nothing about the
	// workload or the node.
	for _, k := range []string{`"mediaType"`, `"version"`, `"chunks"`} {
		if !bytes.Contains(a, []byte(k)) {
			t.Errorf("document lacks %s", k)
		}
	}
	if n := bytes.Count(a, []byte(`":`)); n != 3 {
		t.Errorf("document has %d fields, want 3:\n%s", n, a)
	}
	empty, err := Parse(New(dg("v"), nil).Encode())
	if err != nil || empty.Chunks == nil || len(empty.Chunks) != 0 {
		t.Fatalf("empty profile: %+v, %v", empty, err)
	}
}

func TestParseRefusesHostileDocuments(t *testing.T) {
	v := dg("v")
	doc := func(chunks ...string) string {
		return fmt.Sprintf(`{"mediaType":%q,"version":%q,"chunks":[%s]}`, MediaType, v, strings.Join(chunks, ","))
	}
	many := make([]string, MaxChunks+1)
	for i := range many {
		many[i] = fmt.Sprintf("%q", dg(fmt.Sprint(i)))
	}
	cases := map[string]string{
		"huge":             `{"chunks":[` + strings.Repeat(" ", MaxBytes) + `]}`,
		"too many chunks":  doc(many...),
		"malformed digest": doc(`"sha256:zz"`),
		"not sha256":       doc(`"md5:d41d8cd98f00b204e9800998ecf8427e"`),
		"short digest":     doc(`"sha256:abcd"`),
		"listed twice":     doc(fmt.Sprintf("%q", dg("x")), fmt.Sprintf("%q", dg("x"))),
		"media type":       `{"mediaType":"application/json","version":"` + string(v) + `","chunks":[]}`,
		"bad version":      `{"mediaType":"` + MediaType + `","version":"../x","chunks":[]}`,
		"unknown field":    `{"mediaType":"` + MediaType + `","version":"` + string(v) + `","chunks":[],"host":"n1"}`,
		"trailing data":    doc() + `{}`,
		"not json":         `chunks`,
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := Parse([]byte(b))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse = %v, %v; want ErrInvalid", p, err)
			}
			if len(err.Error()) > 300 {
				t.Errorf("error of %d bytes, want a short one", len(err.Error()))
			}
		})
	}
}

func TestRecorderKeepsFirstReadOrder(t *testing.T) {
	r := NewRecorder(Window{})
	var wg sync.WaitGroup
	for _, k := range []int{5, 2, 5, 9, 2, 0} {
		r.Read(k)
	}
	for range 4 { // concurrent rereads add nothing
		wg.Go(func() { r.Read(9); r.Read(5) })
	}
	wg.Wait()
	if got := fmt.Sprint(r.Chunks()); got != "[5 2 9 0]" {
		t.Fatalf("recorded %s, want [5 2 9 0]", got)
	}
	r.Stop()
	r.Read(7)
	if got := len(r.Chunks()); got != 4 {
		t.Fatalf("a read after Stop was recorded: %d chunks", got)
	}
	if err := r.Wait(context.Background()); err != nil {
		t.Fatalf("Wait after Stop: %v", err)
	}
}

func TestRecorderBounds(t *testing.T) {
	t.Run("chunks", func(t *testing.T) {
		r := NewRecorder(Window{MaxChunks: 3})
		for k := range 10 {
			r.Read(k)
		}
		if got := fmt.Sprint(r.Chunks()); got != "[0 1 2]" {
			t.Fatalf("recorded %s, want the first 3", got)
		}
		if err := r.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("quiet", func(t *testing.T) {
		now := time.Unix(1000, 0)
		r := NewRecorder(Window{Quiet: 5 * time.Second})
		r.now = func() time.Time { return now }
		r.Read(1)
		now = now.Add(4 * time.Second)
		r.Read(2)
		now = now.Add(6 * time.Second) // a pause of 6s: the window closed
		r.Read(3)
		if got := fmt.Sprint(r.Chunks()); got != "[1 2]" {
			t.Fatalf("recorded %s, want [1 2]", got)
		}
	})
	t.Run("time", func(t *testing.T) {
		now := time.Unix(1000, 0)
		r := NewRecorder(Window{Quiet: time.Hour, MaxTime: 10 * time.Second})
		r.now = func() time.Time { return now }
		r.start = now
		for k := range 20 {
			r.Read(k)
			now = now.Add(time.Second)
		}
		if got := len(r.Chunks()); got != 10 {
			t.Fatalf("recorded %d chunks in a 10s window at one a second, want 10", got)
		}
	})
	t.Run("wait ends on a pause", func(t *testing.T) {
		r := NewRecorder(Window{Quiet: 50 * time.Millisecond})
		r.Read(1)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Wait(ctx); err != nil {
			t.Fatalf("Wait did not end after reads paused: %v", err)
		}
	})
}

func TestOrderFollowsTheProfile(t *testing.T) {
	v := version(t, 1)
	n := v.NumChunks()
	want := []int{n - 1, 0, n / 2, 1}
	var ds []digest.Digest
	for _, k := range want {
		ds = append(ds, v.Index.ChunkDigest(k))
	}
	ds = append(ds[:2], append([]digest.Digest{dg("not in this version")}, ds[2:]...)...)
	got, err := New(v.Root.Digest, ds).Order(v)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("order %v, want %v (an unknown chunk skipped)", got, want)
	}
	// The recorder's profile of the same reads gives the same order.
	r := NewRecorder(Window{})
	for _, k := range want {
		r.Read(k)
	}
	r.Read(n + 5) // not a chunk of v
	p := r.Profile(v)
	if again, _ := p.Order(v); fmt.Sprint(again) != fmt.Sprint(want) || p.Version != v.Root.Digest {
		t.Fatalf("recorded profile orders %v for %s, want %v for %s", again, p.Version, want, v.Root.Digest)
	}
}

func TestProfileOfAnotherVersionIgnored(t *testing.T) {
	v, other := version(t, 1), version(t, 7)
	p := New(other.Root.Digest, []digest.Digest{other.Index.ChunkDigest(0), v.Index.ChunkDigest(0)})
	got, err := p.Order(v)
	if !errors.Is(err, ErrOtherVersion) || got != nil {
		t.Fatalf("Order = %v, %v; want nothing and ErrOtherVersion", got, err)
	}
	s := Store{Dir: t.TempDir()}
	if err := s.Save(p); err != nil {
		t.Fatal(err)
	}
	// A file of another version under v's name is not v's profile.
	if err := os.Rename(s.Path(other.Root.Digest), s.Path(v.Root.Digest)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(v.Root.Digest); !errors.Is(err, ErrOtherVersion) {
		t.Fatalf("Load = %v, want ErrOtherVersion", err)
	}
}

func TestStoreSavesAndLoads(t *testing.T) {
	s := StoreIn(t.TempDir())
	v := dg("v")
	if _, err := s.Load(v); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Load of nothing = %v, want ErrNotFound", err)
	}
	p := New(v, []digest.Digest{dg("b"), dg("a")})
	if err := s.Save(p); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load(v)
	if err != nil || fmt.Sprint(got.Chunks) != fmt.Sprint(p.Chunks) {
		t.Fatalf("Load = %+v, %v", got, err)
	}
	if err := os.WriteFile(s.Path(v), bytes.Repeat([]byte("x"), MaxBytes+10), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(v); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Load of a huge file = %v, want ErrInvalid", err)
	}
	if _, err := s.Load("sha256:../../etc"); err == nil {
		t.Fatal("Load of a malformed digest succeeded")
	}
}

func TestPushAndFetchAsReferrer(t *testing.T) {
	ctx := context.Background()
	ref, err := oci.ParseRef("oci:" + filepath.Join(t.TempDir(), "layout") + ":v1")
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	subject := pushSubject(t, tgt)
	if _, err := Fetch(ctx, tgt, subject); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Fetch before a push = %v, want ErrNotFound", err)
	}
	p := New(subject.Digest, []digest.Digest{dg("c2"), dg("c1")})
	if _, err := Push(ctx, tgt, ocispec.Descriptor{MediaType: subject.MediaType, Digest: dg("other"), Size: 2}, p); !errors.Is(err, ErrOtherVersion) {
		t.Fatalf("Push onto another version = %v, want ErrOtherVersion", err)
	}
	m1, err := Push(ctx, tgt, subject, p)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := Push(ctx, tgt, subject, p)
	if err != nil || m2.Digest != m1.Digest {
		t.Fatalf("second push: %s, %v; want the same manifest %s", m2.Digest, err, m1.Digest)
	}
	got, err := Fetch(ctx, tgt, subject)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Encode(), p.Encode()) {
		t.Fatalf("fetched\n%s\nwant\n%s", got.Encode(), p.Encode())
	}
}

// pushSubject stores a small manifest in t to attach profiles to.
func pushSubject(t *testing.T, tgt oci.Target) ocispec.Descriptor {
	t.Helper()
	b := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[]}`)
	cfg := ocispec.DescriptorEmptyJSON
	if err := tgt.Push(context.Background(), ocispec.Descriptor{MediaType: cfg.MediaType, Digest: cfg.Digest, Size: cfg.Size}, bytes.NewReader(cfg.Data)); err != nil {
		t.Fatal(err)
	}
	d := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := tgt.Push(context.Background(), d, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	if err := tgt.Tag(context.Background(), d, "v1"); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestFetchAsksForTheFirstPagesOnly: a registry that lists fresh profile
// referrers for ever (five a page, the real profile on the first) costs
// Fetch the four pages that hold maxReferrers of them, and the real
// profile is found among them.
func TestFetchAsksForTheFirstPagesOnly(t *testing.T) {
	ctx := context.Background()
	reg := ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0)), ggcr.WithReferrersSupport(true))
	var pages atomic.Int64
	var real atomic.Value // the real profile's manifest descriptor
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/referrers/") || real.Load() == nil {
			reg.ServeHTTP(w, r)
			return
		}
		n := pages.Add(1)
		i, _ := strconv.Atoi(r.URL.Query().Get("page"))
		var ds []ocispec.Descriptor
		for k := range 5 {
			ds = append(ds, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: MediaType,
				Digest: dg(fmt.Sprintf("%d/%d", i, k)), Size: 300})
		}
		if i == 0 {
			ds[2] = real.Load().(ocispec.Descriptor)
		}
		if n < 500 {
			w.Header().Set("Link", fmt.Sprintf(`<%s?page=%d>; rel="next"`, r.URL.Path, i+1))
		}
		w.Header().Set("Content-Type", ocispec.MediaTypeImageIndex)
		json.NewEncoder(w).Encode(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: ds})
	}))
	defer srv.Close()
	ref, err := oci.ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/vol/r:v1")
	if err != nil {
		t.Fatal(err)
	}
	tgt, err := oci.Open(ctx, ref, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	subject := pushSubject(t, tgt)
	p := New(subject.Digest, []digest.Digest{dg("c1")})
	md, err := Push(ctx, tgt, subject, p)
	if err != nil {
		t.Fatal(err)
	}
	md.ArtifactType = MediaType
	real.Store(md)
	pages.Store(0)
	got, err := Fetch(ctx, tgt, subject)
	if err != nil || !bytes.Equal(got.Encode(), p.Encode()) {
		t.Fatalf("Fetch: %v", err)
	}
	if n := pages.Load(); n > (maxReferrers+4)/5 {
		t.Fatalf("Fetch asked for %d referrer pages, want at most %d", n, (maxReferrers+4)/5)
	}
}
