package mounts

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

func TestFromSpecPlacesMountsAndResolvesKeys(t *testing.T) {
	dir := t.TempDir()
	spec := filepath.Join(dir, "bdnvol.yaml")
	os.WriteFile(spec, []byte(`mounts:
- source: r.example/a:v1
  path: /models/a
  readOnly: true
- source: r.example/b@sha256:`+strings.Repeat("0", 64)+`
  path: /models/b
`), 0o644)
	var warned []string
	warn := func(f string, a ...any) { warned = append(warned, fmt.Sprintf(f, a...)) }
	ts, err := FromSpec(spec, "/root", "", warn)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || ts[0].Mountpoint != "/root/models/a" || ts[1].Mountpoint != "/root/models/b" ||
		ts[0].Ref.Repository != "a" || ts[1].Ref.Digest == "" || ts[0].Policy.Required() {
		t.Fatalf("targets = %+v", ts)
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "/models/b is mounted read-only") {
		t.Errorf("warnings = %q; want one for /models/b", warned)
	}
	// A relative key is looked up next to the deploy file; a missing one
	// names the file and the mount.
	os.WriteFile(spec, []byte("mounts:\n- source: r.example/a:v1\n  path: /a\n  readOnly: true\n  requireSignature: k.pub\n"), 0o644)
	_, err = FromSpec(spec, "/root", "", nil)
	if err == nil || !strings.Contains(err.Error(), spec+": mount /a:") || !strings.Contains(err.Error(), filepath.Join(dir, "k.pub")) {
		t.Errorf("missing key: %v", err)
	}
	// The default key applies to a mount that names none.
	os.WriteFile(spec, []byte("mounts:\n- source: r.example/a:v1\n  path: /a\n  readOnly: true\n"), 0o644)
	if _, err := FromSpec(spec, "/root", filepath.Join(dir, "default.pub"), nil); err == nil || !strings.Contains(err.Error(), "default.pub") {
		t.Errorf("missing default key: %v", err)
	}
	os.WriteFile(spec, []byte("mounts: []\n"), 0o644)
	if _, err := FromSpec(spec, "/root", "", nil); err == nil || !strings.HasPrefix(err.Error(), spec+": ") {
		t.Errorf("empty spec: %v", err)
	}
	if _, err := FromSpec(filepath.Join(dir, "none.yaml"), "/root", "", nil); !os.IsNotExist(err) {
		t.Errorf("missing spec: %v", err)
	}
}

func TestPrepareCreatesSpecMountpoints(t *testing.T) {
	root := t.TempDir()
	ts := []Target{{Mountpoint: filepath.Join(root, "a", "b")}}
	// Without mkdir a missing mountpoint is an error naming it.
	if err := Prepare(Store{Dir: t.TempDir()}, ts, false, nil); err == nil || !strings.Contains(err.Error(), ts[0].Mountpoint) {
		t.Fatalf("Prepare of a missing mountpoint = %v", err)
	}
	if _, err := os.Stat(ts[0].Mountpoint); !os.IsNotExist(err) {
		t.Fatalf("created without mkdir: %v", err)
	}
	if err := Prepare(Store{Dir: t.TempDir()}, ts, true, nil); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(ts[0].Mountpoint); err != nil || !st.IsDir() {
		t.Fatalf("mountpoint not created: %v", err)
	}
}

// layoutVersion publishes a small tree as tag v1 of an OCI layout.
func layoutVersion(t *testing.T) (oci.Ref, map[string]string) {
	t.Helper()
	src := t.TempDir()
	files := map[string]string{"a.txt": "alpha\n", "sub/b.txt": "beta beta\n"}
	for p, s := range files {
		os.MkdirAll(filepath.Join(src, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(src, p), []byte(s), 0o644)
	}
	ref, err := oci.ParseRef("oci:" + filepath.Join(t.TempDir(), "layout") + ":v1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tg, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := versions.Publish(ctx, tg, push.DirSource(src), versions.PublishOptions{Tag: "v1"}); err != nil {
		t.Fatal(err)
	}
	return ref, files
}

func TestRunServesEveryTargetUntilCanceled(t *testing.T) {
	requireFUSE(t)
	ref, files := layoutVersion(t)
	cache, err := chunkcache.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	store := Store{Dir: t.TempDir()}
	ts := []Target{{Ref: ref, Mountpoint: t.TempDir()}, {Ref: ref, Mountpoint: t.TempDir()}}
	for _, tg := range ts {
		t.Cleanup(func() { Detach(tg.Mountpoint) })
	}
	var mu sync.Mutex
	var logs []string
	held, released := 0, 0
	ready := make(chan []*Served, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, ts, RunOptions{
			Open:  OpenOptions{Cache: cache, Mirrors: oci.MirrorConfig{URLs: []string{"https://mirror.example"}}},
			Serve: ServeOptions{Store: &store, Logf: func(f string, a ...any) { mu.Lock(); logs = append(logs, fmt.Sprintf(f, a...)); mu.Unlock() }},
			Hold: func(*Served) func() {
				mu.Lock()
				held++
				mu.Unlock()
				return func() { mu.Lock(); released++; mu.Unlock() }
			},
			Ready: func(all []*Served) { ready <- all },
		})
	}()
	var all []*Served
	select {
	case all = <-ready:
	case err := <-done:
		t.Fatalf("Run ended before the mounts were ready: %v", err)
	}
	if len(all) != 2 || !strings.HasPrefix(all[0].Pinned, ref.Repo()+"@sha256:") {
		t.Fatalf("ready with %d mounts, pinned %q", len(all), all[0].Pinned)
	}
	for _, tg := range ts {
		for p, want := range files {
			if b, err := os.ReadFile(filepath.Join(tg.Mountpoint, p)); err != nil || string(b) != want {
				t.Errorf("%s/%s: %q, %v", tg.Mountpoint, p, b, err)
			}
		}
		if st, ok := store.Read(tg.Mountpoint); !ok || st.CacheDir != cache.Dir() {
			t.Errorf("state of %s = %+v, %v; want the cache recorded", tg.Mountpoint, st, ok)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, tg := range ts {
		if _, ok := At(tg.Mountpoint); ok {
			t.Errorf("%s still mounted after Run returned", tg.Mountpoint)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if held != 2 || released != 2 {
		t.Errorf("held %d, released %d; want 2 and 2", held, released)
	}
	joined := strings.Join(logs, "\n")
	if strings.Count(joined, "is a local layout; mirrors are not used") != 2 || strings.Count(joined, "unmounted ") != 2 {
		t.Errorf("logs:\n%s", joined)
	}
}

func TestRunUnmountsEarlierTargetsWhenOneFails(t *testing.T) {
	requireFUSE(t)
	ref, _ := layoutVersion(t)
	missing := ref
	missing.Tag = "nope"
	ts := []Target{{Ref: ref, Mountpoint: t.TempDir()}, {Ref: missing, Mountpoint: t.TempDir()}}
	t.Cleanup(func() { Detach(ts[0].Mountpoint) })
	cache, err := chunkcache.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	err = Run(context.Background(), ts, RunOptions{
		Open:  OpenOptions{Cache: cache},
		Ready: func([]*Served) { t.Error("Ready called although a target failed") },
	})
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("Run = %v; want the missing tag named", err)
	}
	if _, ok := At(ts[0].Mountpoint); ok {
		t.Error("the first target is still mounted after the second failed")
	}
}
