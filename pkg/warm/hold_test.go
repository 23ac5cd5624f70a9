package warm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/mounts"
	"github.com/bdnvol/bdnvol/pkg/push"
)

// servedVolume seals a small tree into memory and opens it lazily over a
// cache, as a mount serves it.
func servedVolume(t *testing.T) (*chunkcache.Cache, *mounts.Served) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("alpha\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	store := memory.New()
	res, err := push.Push(ctx, store, push.DirSource(dir), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := chunkcache.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	v, err := lazy.Open(ctx, store, res.Root, lazy.Options{Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return cache, &mounts.Served{Mountpoint: t.TempDir(), Pinned: "reg.example/a@" + res.Root.Digest.String(), Volume: v}
}

func TestHoldServedRecordsTheVersion(t *testing.T) {
	cache, s := servedVolume(t)
	var logged []string
	release := HoldServed(cache, func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) })(s)
	defer release()
	if len(logged) > 0 {
		t.Fatalf("logged %q", logged)
	}
	rec, err := StoreOf(cache).Get(s.Volume.Root().Digest)
	if err != nil || rec.Pinned != s.Pinned || rec.Ref != s.Pinned || rec.Used.IsZero() {
		t.Fatalf("record %+v, %v", rec, err)
	}
}

func TestHoldServedLogsAFailedRecord(t *testing.T) {
	cache, s := servedVolume(t)
	if err := os.WriteFile(filepath.Join(cache.Dir(), "versions"), []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	var logged []string
	release := HoldServed(cache, func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) })(s)
	if len(logged) != 1 {
		t.Fatalf("logged %q, want the error once", logged)
	}
	release()
}

func TestEntryJSONIsTheCacheListingRow(t *testing.T) {
	e := Entry{Record: Record{Ref: "r/a:v1", Pinned: "r/a@sha256:x", Patterns: "*.json", Chunks: []Blob{{Size: 3}}},
		Cached: 3, Total: 5, Complete: false, InUse: true}
	b, err := json.Marshal([]Entry{e})
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"ref":"r/a:v1","pinned":"r/a@sha256:x","patterns":"*.json","cached":3,"total":5,"complete":false,"in_use":true}]`
	if string(b) != want {
		t.Errorf("JSON %s\nwant %s", b, want)
	}
	e.Patterns = ""
	b, _ = json.Marshal(e)
	if want := `{"ref":"r/a:v1","pinned":"r/a@sha256:x","cached":3,"total":5,"complete":false,"in_use":true}`; string(b) != want {
		t.Errorf("without globs: %s\nwant %s", b, want)
	}
}
