package versions

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/source"
)

func TestSyncSealsVerifiesAndTags(t *testing.T) {
	ctx := context.Background()
	body := testutil.Pattern(3, 200<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "weights.bin", t0, strings.NewReader(string(body)))
	}))
	t.Cleanup(srv.Close)
	src := srv.URL + "/models/weights.bin"
	dst, err := oci.ParseRef("oci:" + filepath.Join(t.TempDir(), "vol") + ":main")
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckSync(ctx, src, dst.String(), []string{"stable"}, source.Options{}); err != nil {
		t.Fatalf("CheckSync of a good sync: %v", err)
	}
	var events []string
	res, err := Sync(ctx, src, dst, SyncOptions{
		Tags: []string{"stable"}, Counters: &progress.Counters{},
		Source:     source.Options{AllowPrivateNetwork: true}, // the source is on loopback
		OnListing:  func(string) { events = append(events, "listing") },
		OnListed:   func(files int, _ int64, _ string) { events = append(events, "listed") },
		OnVerified: func() { events = append(events, "verified") },
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(events, " ") != "listing listed verified" {
		t.Errorf("events %q", events)
	}
	if len(res.Tags) != 3 || res.Tags[1] != "main" || res.Tags[2] != "stable" || res.Files != 1 {
		t.Fatalf("synced %d files, tags %v", res.Files, res.Tags)
	}
	tg, err := oci.Open(ctx, dst, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	root, err := Resolve(ctx, tg, dst)
	if err != nil || root.Desc.Digest != res.Root.Digest {
		t.Fatalf("main resolves to %v (%v), want %s", root.Desc.Digest, err, res.Root.Digest)
	}
	if ms := historyOf(t, tg, "main"); len(ms) != 1 || ms[0].Digest != res.Root.Digest {
		t.Errorf("history of main: %+v", ms)
	}
}

func TestCheckSyncRefuses(t *testing.T) {
	ctx := context.Background()
	layoutRef := "oci:" + filepath.Join(t.TempDir(), "vol")
	for _, tc := range []struct{ src, dst, want string }{
		{"https://example.com/f.bin", layoutRef + "@sha256:" + strings.Repeat("0", 64), "not a digest"},
		{"https://example.com/f.bin", "not a ref", "invalid reference"},
		{"ftp://example.com/f.bin", layoutRef + ":main", "ftp://"},
	} {
		err := CheckSync(ctx, tc.src, tc.dst, nil, source.Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckSync(%s, %s) = %v; want an error with %q", tc.src, tc.dst, err, tc.want)
		}
	}
	if err := CheckSync(ctx, "https://example.com/f.bin", layoutRef+":main", []string{oci.SealedTagPrefix + "x"}, source.Options{}); !errors.Is(err, ErrReservedTag) {
		t.Errorf("CheckSync with a reserved extra tag: %v", err)
	}
}
