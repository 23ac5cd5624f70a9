package pull

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// fileState is what a test checks did not change: type, mode, contents.
type fileState struct {
	mode fs.FileMode
	data string
}

func states(t *testing.T, root string) map[string]fileState {
	t.Helper()
	m := map[string]fileState{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		s := fileState{mode: info.Mode()}
		switch {
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s.data = string(b)
		case info.Mode()&fs.ModeSymlink != 0:
			s.data, _ = os.Readlink(p)
		}
		m[p] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func oldTmpName(p string) string {
	h := sha256.Sum256([]byte(p))
	return ".bdnvol-" + hex.EncodeToString(h[:8]) + ".part"
}

// checkPulled checks dst holds exactly the files of want (and nothing of
// bdnvol's own), as regular files with one link.
func checkPulled(t *testing.T, dst string, want map[string][]byte, modes map[string]fs.FileMode, keepPrivate ...bool) {
	t.Helper()
	for p, data := range want {
		full := filepath.Join(dst, p)
		info, err := os.Lstat(full)
		if err != nil || !info.Mode().IsRegular() {
			t.Errorf("%s: not a regular file (%v, %v)", p, info, err)
			continue
		}
		if got, _ := os.ReadFile(full); !bytes.Equal(got, data) {
			t.Errorf("%s: wrong contents %q", p, got)
		}
		if n := nlink(info); n != 1 {
			t.Errorf("%s: %d links", p, n)
		}
		if m, ok := modes[p]; ok && info.Mode().Perm() != m {
			t.Errorf("%s: mode %v, want %v", p, info.Mode().Perm(), m)
		}
	}
	names, _ := filepath.Glob(filepath.Join(dst, pullDirName+"*"))
	if len(keepPrivate) == 0 && len(names) > 0 || len(keepPrivate) > 0 && len(names) != 1 {
		t.Errorf("after success: %q", names)
	}
}

// TestPullPlantedLinks pulls into a directory where someone planted
// symlinks and hard links, at final names, at the temporary names an older
// bdnvol used, at the private directory's name and inside it: nothing
// outside the directory changes, and the pull puts the right files in place.
func TestPullPlantedLinks(t *testing.T) {
	files := map[string][]byte{
		"f":          []byte("file f\n"),
		"g":          []byte("file g\n"),
		"h":          []byte("file h\n"),
		"sub/deep":   []byte("deep\n"),
		"sub2/x":     []byte("x\n"),
		"l@":         []byte("f"),
		"sub/link2@": []byte("deep"),
	}
	_, _ = pushed(t, layout.DefaultParams, map[string][]byte{"x": nil}) // warm the helper
	store, v := pushed(t, layout.Params{Min: 64, Avg: 128, Max: 256}, files)
	regular := map[string][]byte{}
	for p, b := range files {
		if !strings.HasSuffix(p, "@") {
			regular[p] = b
		}
	}
	type plant struct {
		name string
		make func(t *testing.T, dst, out string)
	}
	symlink := func(target, at string) func(t *testing.T, dst, out string) {
		return func(t *testing.T, dst, out string) {
			if err := os.Symlink(filepath.Join(out, target), filepath.Join(dst, at)); err != nil {
				t.Fatal(err)
			}
		}
	}
	hardlink := func(target, at string) func(t *testing.T, dst, out string) {
		return func(t *testing.T, dst, out string) {
			if err := os.Link(filepath.Join(out, target), filepath.Join(dst, at)); err != nil {
				t.Fatal(err)
			}
		}
	}
	privateWith := func(mode os.FileMode, then func(t *testing.T, dst, out string)) func(t *testing.T, dst, out string) {
		return func(t *testing.T, dst, out string) {
			if err := os.Mkdir(filepath.Join(dst, pullDirName), mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(dst, pullDirName), mode); err != nil {
				t.Fatal(err)
			}
			then(t, dst, out)
		}
	}
	plants := []plant{
		{"symlink at final name", symlink("victim", "f")},
		{"hard link at final name, matching", hardlink("g-twin", "g")},
		{"hard link at final name, other bytes", hardlink("victim", "h")},
		{"symlink at old temporary name", symlink("victim", oldTmpName("f"))},
		{"hard link at old temporary name", hardlink("victim", oldTmpName("g"))},
		{"symlink as private directory", symlink("dir", pullDirName)},
		{"symlink as directory entry", symlink("dir", "sub")},
		{"symlink as symlink entry", symlink("victim", "l")},
		{"symlink in private directory", privateWith(0o700, symlink("victim", pullDirName+"/"+tmpName("f")))},
		{"hard link in private directory", privateWith(0o700, hardlink("victim", pullDirName+"/"+tmpName("g")))},
		{"open private directory", privateWith(0o777, symlink("victim", pullDirName+"/"+tmpName("h")))},
	}
	for _, stepwise := range []bool{false, true} {
		for _, pl := range plants {
			t.Run(fmt.Sprintf("%s/stepwise=%v", pl.name, stepwise), func(t *testing.T) {
				base := t.TempDir()
				out, dst := filepath.Join(base, "outside"), filepath.Join(base, "dst")
				testutil.WriteTree(t, out, map[string][]byte{"victim": []byte("victim\n"), "g-twin": files["g"], "dir/keep": []byte("keep\n")})
				if err := os.Chmod(filepath.Join(out, "g-twin"), 0o640); err != nil {
					t.Fatal(err)
				}
				if err := os.MkdirAll(dst, 0o755); err != nil {
					t.Fatal(err)
				}
				pl.make(t, dst, out)
				before := states(t, out)

				d, err := openDest(dst)
				if err != nil {
					t.Fatal(err)
				}
				d.res.Stepwise.Store(stepwise)
				_, err = materialise(context.Background(), store, v, d, Options{Jobs: 2})
				d.close(err == nil)
				if err != nil {
					t.Fatalf("pull: %v", err)
				}
				after := states(t, out)
				for p, s := range before {
					if after[p] != s {
						t.Errorf("outside changed: %s was %+v, is %+v", p, s, after[p])
					}
				}
				if len(after) != len(before) {
					t.Errorf("outside has %d entries, had %d", len(after), len(before))
				}
				if pl.name == "open private directory" {
					checkPulled(t, dst, regular, map[string]fs.FileMode{"g": 0o644}, true)
				} else {
					checkPulled(t, dst, regular, map[string]fs.FileMode{"g": 0o644})
				}
				if got, err := os.Readlink(filepath.Join(dst, "l")); err != nil || got != "f" {
					t.Errorf("symlink l: %q %v", got, err)
				}
			})
		}
	}
}

// failing fails fetches of one chunk with not-found (no retry).
type failing struct {
	content.Fetcher
	target digest.Digest
}

func (f failing) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	if d.Digest == f.target {
		return nil, fmt.Errorf("%s: %w", d.Digest, errdef.ErrNotFound)
	}
	return f.Fetcher.Fetch(ctx, d)
}

// TestPullResumes: a pull that failed leaves its temporary files in the
// private directory; the next one fetches only the chunks still missing.
func TestPullResumes(t *testing.T) {
	ctx := context.Background()
	data := testutil.RandBytes(21, 300<<10)
	store, v := pushed(t, layout.Params{Min: 8 << 10, Avg: 32 << 10, Max: 64 << 10}, map[string][]byte{"d/f.bin": data, "small": []byte("s")})
	if v.NumChunks() < 4 {
		t.Fatalf("premise: several chunks, got %d", v.NumChunks())
	}
	dst := t.TempDir()
	var big layout.File
	for _, f := range v.Index.AllFiles() {
		if f.Path == "d/f.bin" {
			big = f
		}
	}
	last := v.Index.ChunkDigest(big.Extents[len(big.Extents)-1].Chunk)
	if _, err := Materialise(ctx, failing{store, last}, v, dst, Options{Jobs: 1}); err == nil {
		t.Fatal("pull with a missing chunk succeeded")
	}
	if _, err := os.Stat(filepath.Join(dst, pullDirName, tmpName("d/f.bin"))); err != nil {
		t.Fatalf("no temporary file left to resume from: %v", err)
	}
	res, err := Materialise(ctx, store, v, dst, Options{Jobs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.ChunksFetched != 1 {
		t.Errorf("resumed pull fetched %d chunks, want the 1 missing", res.ChunksFetched)
	}
	checkPulled(t, dst, map[string][]byte{"d/f.bin": data, "small": []byte("s")}, nil)
}

// TestLeftoverExtentsSkipsHoles: checking a temporary file left by an
// interrupted pull reads only what was written, not its declared size.
func TestLeftoverExtentsSkipsHoles(t *testing.T) {
	const chunk = 1 << 20
	const n = 16 << 10 // 16 GiB declared
	x := &layout.Index{Version: 1, Chunking: v1Params}
	f := layout.File{Path: "big", Type: layout.TypeFile, Mode: 0o644, Size: n * chunk, Digest: digest.FromString("big")}
	written := map[int][]byte{3: testutil.RandBytes(1, chunk), 9000: testutil.RandBytes(2, chunk), n - 1: testutil.RandBytes(3, chunk)}
	for i := range n {
		d := digest.FromString(fmt.Sprint(i))
		if b, ok := written[i]; ok {
			d = digest.FromBytes(b)
		}
		x.Chunks = append(x.Chunks, layout.Chunk{Digest: d, Size: chunk})
		f.Extents = append(f.Extents, layout.Extent{Chunk: i, Offset: 0, Length: chunk})
	}
	fh, err := os.Create(filepath.Join(t.TempDir(), "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := fh.Truncate(f.Size); err != nil {
		t.Fatal(err)
	}
	for i, b := range written {
		if _, err := fh.WriteAt(b, int64(i)*chunk); err != nil {
			t.Fatal(err)
		}
	}
	// One more written extent with the wrong bytes.
	if _, err := fh.WriteAt(testutil.RandBytes(4, chunk), 5*chunk); err != nil {
		t.Fatal(err)
	}
	done, read := leftoverExtents(context.Background(), fh, &f, x, make([]byte, 64<<10))
	for i := range n {
		_, want := written[i]
		if done[i] != want {
			t.Errorf("extent %d: done %v, want %v", i, done[i], want)
		}
	}
	if read > 8*chunk {
		t.Errorf("read %d bytes of a sparse file with %d written", read, 4*chunk)
	}
	t.Logf("read %d bytes of %d declared", read, f.Size)
}

// fdSamplingFetcher counts bytes delivered and samples open descriptors.
type fdSamplingFetcher struct {
	content.Fetcher
	maxFDs atomic.Int64
}

func (c *fdSamplingFetcher) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	rc, err := c.Fetcher.Fetch(ctx, d)
	if err != nil {
		return nil, err
	}
	return &sampler{ReadCloser: rc, c: c}, nil
}

type sampler struct {
	io.ReadCloser
	c *fdSamplingFetcher
}

func (s *sampler) Read(p []byte) (int, error) {
	n, err := s.ReadCloser.Read(p)
	if des, derr := os.ReadDir("/proc/self/fd"); derr == nil {
		for {
			m := s.c.maxFDs.Load()
			if int64(len(des)) <= m || s.c.maxFDs.CompareAndSwap(m, int64(len(des))) {
				break
			}
		}
	}
	return n, err
}

// TestPullProgressCountsOnce: with a chunk fetched twice (the first body
// cut), processed bytes end at the total, not past it.
func TestPullProgressCountsOnce(t *testing.T) {
	ctx := context.Background()
	data := testutil.RandBytes(31, 300<<10)
	store, v := pushed(t, layout.Params{Min: 8 << 10, Avg: 32 << 10, Max: 64 << 10}, map[string][]byte{"f.bin": data})
	for _, fl := range []*flaky{
		{Fetcher: store, target: v.Chunk(1).Digest, bad: 2, cut: true},
		{Fetcher: store, target: v.Chunk(2).Digest, bad: 1},
	} {
		c := &progress.Counters{}
		if _, err := Materialise(ctx, fl, v, t.TempDir(), Options{Jobs: 2, Counters: c}); err != nil {
			t.Fatal(err)
		}
		if c.Processed.Load() != c.Total.Load() {
			t.Errorf("processed %d of %d bytes", c.Processed.Load(), c.Total.Load())
		}
	}
}
