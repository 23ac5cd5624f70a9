package modelpack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

// cacheFixture is a model of every packing and the bytes of its files.
func cacheFixture(t *testing.T) (*rangeStore, ocispec.Descriptor, map[string][]byte) {
	files := map[string][]byte{
		"model.safetensors": safetensors(11, 2<<20, 3<<20),
		"README.md":         []byte("# cached\n"),
		"shard/a.bin":       testutil.RandBytes(12, 90_000),
		"config.json":       []byte(`{"architectures":["Y"]}`),
	}
	mem, desc := pushModel(t,
		rawLayer(KindWeight, "model.safetensors", files["model.safetensors"]),
		rawLayer(KindDoc, "README.md", files["README.md"]),
		tarLayer(t, KindWeight, PackingTar, tarMember{name: "shard/a.bin", data: files["shard/a.bin"]}),
		tarLayer(t, KindWeightConfig, PackingTarGzip, tarMember{name: "config.json", data: files["config.json"]}),
	)
	return &rangeStore{Storage: mem}, desc, files
}

// buildMap is the map Build derives, for comparisons.
func buildMap(t *testing.T, st *rangeStore, desc ocispec.Descriptor) *Map {
	a, err := Fetch(context.Background(), st, desc)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Build(context.Background(), st, a)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestIndexCacheKeepsIndex: the first open derives the index from the
// layers and keeps it; a second open, by another cache value on the same
// directory (another process), fetches only the manifest, and gives the
// same index, files and pieces: every file reads back byte for byte.
func TestIndexCacheKeepsIndex(t *testing.T) {
	st, desc, files := cacheFixture(t)
	dir := filepath.Join(t.TempDir(), "indexes")
	v1, err := OpenCached(context.Background(), st, desc, OpenIndexCache(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	if st.whole != 5 { // the manifest and the four layers
		t.Fatalf("cold open: %d whole fetches, want 5", st.whole)
	}
	fi, err := os.Stat(filepath.Join(dir, "sha256-"+desc.Digest.Encoded()))
	if err != nil {
		t.Fatalf("no record kept: %v", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("record mode %v, want private", fi.Mode())
	}
	st.whole = 0
	v2, err := OpenCached(context.Background(), st, desc, OpenIndexCache(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	if st.whole != 1 || len(st.ranges) != 0 {
		t.Fatalf("open with the index kept: %d whole fetches and %d ranges, want the manifest only", st.whole, len(st.ranges))
	}
	if !reflect.DeepEqual(v1.Index.AllFiles(), v2.Index.AllFiles()) || !reflect.DeepEqual(v1.Index.AllChunks(), v2.Index.AllChunks()) {
		t.Fatal("the kept index differs from the derived one")
	}
	if !reflect.DeepEqual(v1.Streamed, v2.Streamed) || !v2.Streamed["config.json"] || len(v2.Streamed) != 1 {
		t.Fatalf("streamed files %v, derived %v", v2.Streamed, v1.Streamed)
	}
	for p, want := range files {
		if got := readFile(t, v2, st, p); !bytes.Equal(got, want) {
			t.Errorf("%s: read %d bytes through the kept index, want %d", p, len(got), len(want))
		}
	}
	a, _ := Fetch(context.Background(), st, desc)
	m, ok := OpenIndexCache(dir, 0).Load(a)
	want := buildMap(t, st, desc)
	if !ok || !reflect.DeepEqual(m.Pieces, want.Pieces) || !reflect.DeepEqual(m.Files, want.Files) {
		t.Fatal("the kept map's files or pieces differ from Build's")
	}
}

// resealed returns the record b with its body changed by edit and its
// checksum recomputed: an alteration the checksum does not catch.
func resealed(t *testing.T, b []byte, edit func(*indexRecord)) []byte {
	var rec indexRecord
	if err := json.Unmarshal(b[len(indexRecordMagic)+sha256.Size:], &rec); err != nil {
		t.Fatal(err)
	}
	edit(&rec)
	body, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	return append(append([]byte(indexRecordMagic), sum[:]...), body...)
}

// TestIndexCacheRecordsChecked: a torn record, a flipped byte, a record of
// another model under this model's name, and resealed records that move a
// file to another layer, outside its layer, or past its raw layer's size
// are each dropped and the index derived again from the layers (and kept
// anew, checking).
func TestIndexCacheRecordsChecked(t *testing.T) {
	st, desc, files := cacheFixture(t)
	other, odesc, _ := cacheFixture(t)
	dir := filepath.Join(t.TempDir(), "indexes")
	c := OpenIndexCache(dir, 0)
	if _, err := OpenCached(context.Background(), st, desc, c); err != nil {
		t.Fatal(err)
	}
	rp := filepath.Join(dir, "sha256-"+desc.Digest.Encoded())
	good, err := os.ReadFile(rp)
	if err != nil {
		t.Fatal(err)
	}
	// A record of another model (another manifest: a different digest).
	otherMan := ocispec.Descriptor{}
	{
		a, _ := Fetch(context.Background(), other, odesc)
		a.Desc.Digest = digest.Digest("sha256:" + strings.Repeat("ab", 32))
		otherMan = a.Desc
		m := buildMap(t, other, odesc)
		m.Artifact = a
		if err := c.Store(m); err != nil {
			t.Fatal(err)
		}
	}
	foreign, err := os.ReadFile(filepath.Join(dir, "sha256-"+otherMan.Digest.Encoded()))
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)-10] ^= 1
	cases := map[string][]byte{
		"torn":          good[:len(good)/2],
		"empty":         {},
		"flipped byte":  flipped,
		"other model":   foreign,
		"another layer": resealed(t, good, func(r *indexRecord) { r.Files[0].Layer = 1 }),
		"past its layer": resealed(t, good, func(r *indexRecord) {
			for i := range r.Files {
				if r.Files[i].Path == "shard/a.bin" {
					r.Files[i].Offset = 1 << 30
				}
			}
		}),
		"no such layer": resealed(t, good, func(r *indexRecord) { r.Files[0].Layer = 99 }),
		"file missing":  resealed(t, good, func(r *indexRecord) { r.Files = r.Files[1:] }),
		"wrong digest":  resealed(t, good, func(r *indexRecord) { r.Manifest = otherMan.Digest }),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(rp, b, 0o600); err != nil {
				t.Fatal(err)
			}
			a, _ := Fetch(context.Background(), st, desc)
			if _, ok := c.Load(a); ok {
				t.Fatal("the record was trusted")
			}
			if _, err := os.Stat(rp); !os.IsNotExist(err) {
				t.Fatalf("the record that does not check is still there: %v", err)
			}
			os.WriteFile(rp, b, 0o600)
			st.whole = 0
			v, err := OpenCached(context.Background(), st, desc, c)
			if err != nil {
				t.Fatal(err)
			}
			if st.whole != 5 {
				t.Fatalf("%d whole fetches: the layers were not read again", st.whole)
			}
			for p, want := range files {
				if got := readFile(t, v, st, p); !bytes.Equal(got, want) {
					t.Errorf("%s differs", p)
				}
			}
			if now, _ := os.ReadFile(rp); !bytes.Equal(now, good) {
				t.Fatal("the record was not written again as derived")
			}
		})
	}
}

// TestIndexCacheBound: records past the bound go least recently used
// first; a record read is used.
func TestIndexCacheBound(t *testing.T) {
	dir := t.TempDir()
	var stores []*rangeStore
	var descs []ocispec.Descriptor
	for i := range 4 {
		mem, d := pushModel(t, rawLayer(KindWeight, "w.bin", testutil.RandBytes(uint64(100+i), 3<<20)))
		stores, descs = append(stores, &rangeStore{Storage: mem}), append(descs, d)
	}
	_, err := OpenCached(context.Background(), stores[0], descs[0], OpenIndexCache(dir, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(dir, "sha256-"+descs[0].Digest.Encoded()))
	c := OpenIndexCache(dir, 2*fi.Size()+fi.Size()/2) // room for two records
	old := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(dir, "sha256-"+descs[0].Digest.Encoded()), old, old)
	for i := 1; i < 3; i++ {
		if _, err := OpenCached(context.Background(), stores[i], descs[i], c); err != nil {
			t.Fatal(err)
		}
	}
	has := func(i int) bool {
		_, err := os.Stat(filepath.Join(dir, "sha256-"+descs[i].Digest.Encoded()))
		return err == nil
	}
	if has(0) || !has(1) || !has(2) {
		t.Fatalf("kept %v %v %v, want the two most recent", has(0), has(1), has(2))
	}
	// Using record 1 makes record 2 the least recently used.
	os.Chtimes(filepath.Join(dir, "sha256-"+descs[1].Digest.Encoded()), old, old)
	a, _ := Fetch(context.Background(), stores[1], descs[1])
	if _, ok := c.Load(a); !ok {
		t.Fatal("record 1 was not loaded")
	}
	time.Sleep(10 * time.Millisecond)
	if _, err := OpenCached(context.Background(), stores[3], descs[3], c); err != nil {
		t.Fatal(err)
	}
	if !has(1) || has(2) || !has(3) {
		t.Fatalf("kept %v %v %v, want 1 (used) and 3", has(1), has(2), has(3))
	}
	// A record larger than the bound is not kept, and the open works.
	tiny := OpenIndexCache(filepath.Join(dir, "tiny"), 64)
	if _, err := OpenCached(context.Background(), stores[0], descs[0], tiny); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "tiny")); len(ents) != 0 {
		t.Fatalf("a record past the bound was kept: %v", ents)
	}
}

// originFetcher is a fetcher that says which origin it reads, as a chunk
// cache's view does.
type originFetcher struct {
	content.Fetcher
	origin string
}

func (f originFetcher) Origin() string { return f.origin }

// TestIndexCachePerOrigin: the index derived from one repository's layers
// is not handed to a reader of another origin that names the same manifest
// (it reads the layers itself), nor to an unscoped reader; the first
// origin's next open still reads only the manifest.
func TestIndexCachePerOrigin(t *testing.T) {
	st, desc, _ := cacheFixture(t)
	dir := filepath.Join(t.TempDir(), "indexes")
	ctx := context.Background()
	a := originFetcher{st, "reg.example/tenant-a/model"}
	if _, err := OpenCached(ctx, a, desc, OpenIndexCache(dir, 0)); err != nil {
		t.Fatal(err)
	}
	for _, src := range []content.Fetcher{originFetcher{st, "evil.example/x"}, st} {
		st.whole = 0
		if _, err := OpenCached(ctx, src, desc, OpenIndexCache(dir, 0)); err != nil {
			t.Fatal(err)
		}
		if st.whole != 5 {
			t.Errorf("origin %q: %d whole fetches, want 5: another origin's derived index was used", originOf(src), st.whole)
		}
	}
	st.whole = 0
	if _, err := OpenCached(ctx, a, desc, OpenIndexCache(dir, 0)); err != nil {
		t.Fatal(err)
	}
	if st.whole != 1 {
		t.Errorf("origin A's own record: %d whole fetches, want the manifest only", st.whole)
	}
}
