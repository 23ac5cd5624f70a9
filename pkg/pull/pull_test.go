package pull

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// published seals a small tree as tag v1 of an OCI layout.
func published(t *testing.T) (oci.Ref, map[string]string) {
	t.Helper()
	src := t.TempDir()
	files := map[string]string{"a.txt": strings.Repeat("alpha\n", 1000), "sub/b.txt": "beta\n"}
	for p, s := range files {
		os.MkdirAll(filepath.Join(src, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(src, p), []byte(s), 0o644)
	}
	ref, err := oci.ParseRef("oci:" + filepath.Join(t.TempDir(), "vol") + ":v1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(context.Background(), ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := versions.Publish(context.Background(), tg, push.DirSource(src), versions.PublishOptions{Tag: "v1"}); err != nil {
		t.Fatal(err)
	}
	return ref, files
}

func chunksIn(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	filepath.Walk(filepath.Join(dir, "chunks"), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && !strings.HasPrefix(fi.Name(), ".") && !strings.HasSuffix(fi.Name(), ".json") {
			n++
		}
		return nil
	})
	return n
}

func TestPullWritesTheTreeAndUsesTheCacheAsAsked(t *testing.T) {
	ctx := context.Background()
	ref, files := published(t)
	cacheDir := t.TempDir()
	pull := func(mode CacheMode) (*Result, string) {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "out")
		started, stopped := 0, 0
		res, err := Pull(ctx, ref, dir, Options{CacheDir: cacheDir, Cache: mode, CacheSize: 1 << 30, Counters: &progress.Counters{},
			Progress: func() func() { started++; return func() { stopped++ } }})
		if err != nil {
			t.Fatal(err)
		}
		if started != 1 || stopped != 1 {
			t.Errorf("progress started %d, stopped %d times", started, stopped)
		}
		for p, want := range files {
			if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != want {
				t.Errorf("%s: %v", p, err)
			}
		}
		return res, dir
	}
	res, _ := pull(CacheRead)
	if res.Files != 3 || res.ChunksFetched == 0 || res.CacheHits != 0 || !strings.HasPrefix(res.Reference, ref.Repo()+"@sha256:") ||
		res.Digest != strings.TrimPrefix(res.Reference, ref.Repo()+"@") {
		t.Fatalf("first pull: %+v", res)
	}
	if n := chunksIn(t, cacheDir); n != 0 {
		t.Fatalf("a read-only pull added %d chunks to the cache", n)
	}
	pull(CacheOff)
	if n := chunksIn(t, cacheDir); n != 0 {
		t.Fatalf("a pull without the cache added %d chunks", n)
	}
	pull(CacheFill)
	if n := chunksIn(t, cacheDir); n == 0 {
		t.Fatal("a pull that fills the cache added no chunk")
	}
	res, dir := pull(CacheRead)
	if res.CacheHits == 0 {
		t.Errorf("a pull after the cache was filled had no cache hit: %+v", res)
	}
	// Pulling again into the same directory reuses the files there.
	again, err := Pull(ctx, ref, dir, Options{CacheDir: cacheDir, Cache: CacheOff})
	if err != nil || again.FilesReused != 2 || again.ChunksFetched != 0 {
		t.Errorf("second pull into %s: %+v, %v", dir, again, err)
	}
}

func TestPullErrorsNameTheReference(t *testing.T) {
	ref, _ := published(t)
	missing := ref
	missing.Tag = "nope"
	var logs []string
	_, err := Pull(context.Background(), missing, t.TempDir(), Options{CacheDir: t.TempDir(),
		Mirrors: oci.MirrorConfig{URLs: []string{"https://mirror.example"}},
		Logf:    func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }})
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("missing tag: %v", err)
	}
	logs = nil
	if _, err := Pull(context.Background(), ref, t.TempDir(), Options{CacheDir: t.TempDir(), Cache: CacheOff,
		Mirrors: oci.MirrorConfig{URLs: []string{"https://mirror.example"}},
		Logf:    func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }}); err != nil {
		t.Fatal(err)
	}
	if len(logs) != 1 || !strings.Contains(logs[0], "is a local layout; mirrors are not used") {
		t.Errorf("logs for a layout with mirrors: %q", logs)
	}
}

func TestCacheModeOf(t *testing.T) {
	for _, c := range []struct {
		fill, off bool
		want      CacheMode
	}{{false, false, CacheRead}, {true, false, CacheFill}, {false, true, CacheOff}, {true, true, CacheFill}} {
		if got := CacheModeOf(c.fill, c.off); got != c.want {
			t.Errorf("fill %v, off %v: %v, want %v", c.fill, c.off, got, c.want)
		}
	}
}
