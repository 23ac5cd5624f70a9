package warm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
)

// A version record on disk is input: a digest in it that is not a sha256
// digest of 64 hex digits (here one naming "../../victim") must not become
// a path. gc skips the record, says why, and removes nothing it names,
// while a good record next to it goes as usual.
func TestGCSkipsRecordsWithMalformedDigests(t *testing.T) {
	top := t.TempDir()
	cache, err := chunkcache.Open(filepath.Join(top, "cache", "chunks"), 0)
	if err != nil {
		t.Fatal(err)
	}
	victims := []string{filepath.Join(top, "cache", "victim"), filepath.Join(top, "cache", "chunks", "victim.json")}
	for _, v := range victims {
		if err := os.WriteFile(v, []byte("not the cache's"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	store := StoreOf(cache)
	good := digest.FromString("good")
	if err := store.Put(Record{Ref: "reg.example/a:v1", Pinned: "reg.example/a@" + good.String(),
		Root: ocispec.Descriptor{Digest: good, Size: 1}, Chunks: []Blob{{digest.FromString("c"), 1}}}); err != nil {
		t.Fatal(err)
	}
	// Written as a hostile or corrupt file would be: past Put.
	bad := map[digest.Digest]string{
		digest.FromString("chunk"): `{"ref":"x","pinned":"x","root":{"digest":"` + digest.FromString("chunk").String() + `","size":1},` +
			`"chunks":[{"digest":"sha256:../../victim","size":15}]}`,
		digest.FromString("root"): `{"ref":"y","pinned":"y","root":{"digest":"sha256:../victim","size":1},"chunks":[]}`,
		digest.FromString("md5"): `{"ref":"z","pinned":"z","root":{"digest":"` + digest.FromString("md5").String() + `","size":1},` +
			`"chunks":[{"digest":"md5:0123456789abcdef0123456789abcdef","size":15}]}`,
	}
	for d, body := range bad {
		if err := os.WriteFile(filepath.Join(store.Dir, d.Encoded()+".json"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r, err := GC(cache)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range victims {
		if _, err := os.Stat(v); err != nil {
			t.Errorf("%s outside the cache: %v", v, err)
		}
	}
	if len(r.Versions) != 1 || !strings.Contains(r.Versions[0], good.String()) {
		t.Errorf("removed %v: want the good record only", r.Versions)
	}
	if len(r.Skipped) != len(bad) {
		t.Fatalf("skipped %v: want the %d malformed records", r.Skipped, len(bad))
	}
	for _, err := range r.Skipped {
		if !errors.Is(err, ErrBadRecord) {
			t.Errorf("skipped: %v", err)
		}
	}
	for d := range bad {
		if _, err := os.Stat(filepath.Join(store.Dir, d.Encoded()+".json")); err != nil {
			t.Errorf("the malformed record %s was removed: %v", d, err)
		}
	}
	if _, err := Remove(cache, "x"); !errors.Is(err, ErrNoRecord) {
		t.Errorf("rm of a malformed record's ref: %v", err)
	}
}

// TestParseCompanions: `REF warmstate:KEY` lines are the node plugin's:
// ParseList leaves them out, ParseCompanions returns them in order, once
// each; an empty key fails naming its line.
func TestParseCompanions(t *testing.T) {
	list := []byte("# list\nr/a:v1\nr/a:v1 warmstate:engine=vllm,tp=2\nr/b:v1 *.bin\nr/a:v1 warmstate:engine=vllm,tp=2\nr/a:v1 warmstate:engine=vllm,tp=4\n")
	es, err := ParseList(list)
	if err != nil || len(es) != 2 || es[0] != (ListEntry{Ref: "r/a:v1"}) || es[1] != (ListEntry{Ref: "r/b:v1", Patterns: "*.bin"}) {
		t.Fatalf("ParseList: %+v, %v", es, err)
	}
	cs, err := ParseCompanions(list)
	want := []CompanionEntry{{Ref: "r/a:v1", Key: "engine=vllm,tp=2"}, {Ref: "r/a:v1", Key: "engine=vllm,tp=4"}}
	if err != nil || len(cs) != 2 || cs[0] != want[0] || cs[1] != want[1] {
		t.Fatalf("ParseCompanions: %+v, %v", cs, err)
	}
	if _, err := ParseCompanions([]byte("r/a:v1\nr/a:v1 warmstate:\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("an empty key: %v", err)
	}
}
