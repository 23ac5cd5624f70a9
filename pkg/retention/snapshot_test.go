package retention

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

func TestSnapshotAndFileSources(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	v1 := r.push(t, map[string][]byte{"a": testutil.Pattern(1, 10<<10)}, t0, 0, "v1")
	v2 := r.push(t, map[string][]byte{"a": testutil.Pattern(2, 10<<10)}, t0.Add(time.Hour), 0, "v2")
	if _, err := SoftDelete(ctx, r.t, v1.Root.Digest, DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	repo := oci.Ref{Layout: r.dir}

	dir := t.TempDir()
	yaml := filepath.Join(dir, "bdnvol.yaml")
	if err := os.WriteFile(yaml, []byte("mounts:\n  - source: "+repo.Pinned(v2.Root.Digest)+"\n    path: w\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mount := Reference{Source: "/mnt/x", Ref: v1.Root.Digest.String(), Digest: v1.Root.Digest, Mount: true}
	sources, err := FileSources(repo, []string{yaml}, []byte("image: "+repo.Pinned(v1.Root.Digest)+"\n"),
		func() []Reference { return []Reference{mount} })
	if err != nil {
		t.Fatal(err)
	}
	in, err := Snapshot(ctx, r.t, sources)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Versions) != 1 || in.Versions[0].Digest != v2.Root.Digest || in.Versions[0].Tags[0] != "v2" {
		t.Errorf("versions %+v, want v2 alone", in.Versions)
	}
	if len(in.Deleted) != 1 || in.Deleted[0].Digest != v1.Root.Digest {
		t.Errorf("deleted %+v, want v1", in.Deleted)
	}
	var fromFile, fromStdin, fromMount bool
	for _, ref := range in.References {
		fromFile = fromFile || ref.Digest == v2.Root.Digest && filepath.Dir(ref.Source) == dir
		fromStdin = fromStdin || ref.Digest == v1.Root.Digest && ref.Source == "stdin:1"
		fromMount = fromMount || ref == mount
	}
	if !fromFile || !fromStdin || !fromMount {
		t.Errorf("references %+v: from the file %v, stdin %v, the mount %v", in.References, fromFile, fromStdin, fromMount)
	}

	if _, err := FileSources(repo, []string{filepath.Join(dir, "missing.yaml")}, nil, nil); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing refs file: %v", err)
	}
}

func TestPathSourcesReadsStdinOnceForDash(t *testing.T) {
	repo := oci.Ref{Registry: "r.example", Repository: "vol"}
	d := "sha256:" + strings.Repeat("a", 64)
	dir := t.TempDir()
	file := filepath.Join(dir, "k.yaml")
	os.WriteFile(file, []byte("image: r.example/vol:v1\n"), 0o644)
	stdin := strings.NewReader("image: r.example/vol@" + d + "\n")
	sources, err := PathSources(repo, []string{file, "-"}, stdin, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Read at each call; stdin was read once, up front.
	for range 2 {
		refs, err := sources(context.Background())
		if err != nil || len(refs) != 2 || refs[1].Source != "stdin:1" || refs[1].Digest.String() != d {
			t.Fatalf("references %+v, %v", refs, err)
		}
	}
	if _, err := PathSources(repo, []string{"-", "-"}, strings.NewReader(""), nil); !errors.Is(err, ErrStdinTwice) {
		t.Errorf("stdin twice: %v", err)
	}
	// Without "-", stdin is not read.
	if _, err := PathSources(repo, []string{file}, iotest.ErrReader(errors.New("read")), nil); err != nil {
		t.Errorf("stdin read without -: %v", err)
	}
	if _, err := PathSources(repo, []string{"-"}, iotest.ErrReader(errors.New("broken")), nil); err == nil || !strings.Contains(err.Error(), "standard input: broken") {
		t.Errorf("broken stdin: %v", err)
	}
}
