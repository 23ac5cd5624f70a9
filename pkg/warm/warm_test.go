package warm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
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

func TestLimiterPaces(t *testing.T) {
	l := NewLimiter(1 << 20) // 1 MiB/s
	ctx := context.Background()
	start := time.Now()
	for range 3 {
		if err := l.Wait(ctx, 100<<10); err != nil {
			t.Fatal(err)
		}
	}
	// Three reservations of 100 KiB: the third starts after the first two's 200 KiB.
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("3 x 100 KiB at 1 MiB/s took %v, want >= ~195ms", d)
	}
	if NewLimiter(0) != nil || (*Limiter)(nil).Wait(ctx, 1<<40) != nil {
		t.Fatal("no bandwidth must mean no limiter")
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
