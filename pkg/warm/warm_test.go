package warm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
)

func TestParseList(t *testing.T) {
	got, err := ParseList([]byte("# models\nreg.example/a:prod\n\n  reg.example/b@sha256:" + strings.Repeat("ab", 32) + " *.json,*.safetensors\nreg.example/a:prod all\nreg.example/c:v1 all\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []ListEntry{{Ref: "reg.example/a:prod"}, {Ref: "reg.example/b@sha256:" + strings.Repeat("ab", 32), Patterns: "*.json,*.safetensors"}, {Ref: "reg.example/c:v1"}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entry %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := ParseList([]byte("a:b c d\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("three fields: err %v, want one naming line 1", err)
	}
}

func TestStoreRecords(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	d := digest.FromString("root")
	r := Record{Ref: "reg.example/a:prod", Pinned: "reg.example/a@" + d.String(),
		Root:   ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: d, Size: 10},
		Chunks: []Blob{{digest.FromString("x"), 3}, {digest.FromString("y"), 4}}}
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(d)
	if err != nil || got.Bytes() != 7 || got.Pinned != r.Pinned {
		t.Fatalf("Get: %+v %v", got, err)
	}
	if _, err := s.Get(digest.FromString("other")); !errors.Is(err, ErrNoRecord) {
		t.Fatalf("missing record: %v", err)
	}
	release, err := s.Lease(d, t.TempDir()) // a directory that is not a mountpoint
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if s.InUse(d) {
		t.Fatal("a lease whose mountpoint is not mounted holds the version")
	}
	if l, _ := s.List(); len(l) != 1 {
		t.Fatalf("List: %+v", l)
	}
}

// TestWarmerRefusesLayouts: an oci: line in the warm list is an error
// entry; the mounter (root) does not read the node directory it names, even
// when it holds a valid volume.
func TestWarmerRefusesLayouts(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "secret.txt"), []byte("node secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ref := oci.Ref{Layout: filepath.Join(t.TempDir(), "node-dir")}
	tg, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := push.Push(ctx, tg, push.DirSource(src), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(t.TempDir(), "warm-list")
	if err := os.WriteFile(list, []byte(ref.Pinned(res.Root.Digest)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cache, err := chunkcache.Open(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	w := NewWarmer(WarmerOptions{Cache: cache, ListFile: list})
	w.round(ctx)
	st := w.Status()
	if len(st.Entries) != 1 || st.Entries[0].State != StateError || !strings.Contains(st.Entries[0].Error, "oci:") {
		t.Fatalf("status %+v, want one error entry refusing the layout", st.Entries)
	}
	if st.Entries[0].Digest != "" || st.Entries[0].Bytes != 0 {
		t.Errorf("the refused layout was read: %+v", st.Entries[0])
	}
}
