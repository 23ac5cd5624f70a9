package layout

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/errdef"
)

// pushed pushes files (path -> bytes; "->target" as the bytes of a path
// ending in "@" makes a symlink) and opens the version.
func pushed(t *testing.T, p Params, files map[string][]byte) (content.Storage, *Version) {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	regular := map[string][]byte{}
	for name, data := range files {
		if strings.HasSuffix(name, "@") {
			full := filepath.Join(src, strings.TrimSuffix(name, "@"))
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(string(data), full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		regular[name] = data
	}
	writeTree(t, src, regular)
	store := memory.New()
	res, err := Push(ctx, store, DirSource(src), PushOptions{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	v, err := Open(ctx, store, res.Root)
	if err != nil {
		t.Fatal(err)
	}
	return store, v
}

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
	_, _ = pushed(t, DefaultParams, map[string][]byte{"x": nil}) // warm the helper
	store, v := pushed(t, Params{Min: 64, Avg: 128, Max: 256}, files)
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
				writeTree(t, out, map[string][]byte{"victim": []byte("victim\n"), "g-twin": files["g"], "dir/keep": []byte("keep\n")})
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
				_, err = pull(context.Background(), store, v, d, PullOptions{Jobs: 2})
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

// TestValidateReservedNames: no element of an entry's path may be named
// like bdnvol's own files.
func TestValidateReservedNames(t *testing.T) {
	for _, p := range []string{".bdnvol-pull", "d/.bdnvol-pull", "d/.bdnvol-0123456789abcdef.part", ".bdnvol-index.lock"} {
		x := validIndex()
		if strings.HasPrefix(p, "d/") {
			x.Files[1].Path = p
			x.Files[1], x.Files[2] = x.Files[2], x.Files[1] // keep sorted: d/.b < d/l
			x.Files[1], x.Files[2] = x.Files[2], x.Files[1]
			x.Files = []File{x.Files[0], x.Files[1]}
		} else {
			x.Files = append([]File{{Path: p, Type: TypeFile, Mode: 0o644, Size: 10, Digest: digest.FromString("f"), Extents: []Extent{{0, 0, 10}}}}, x.Files...)
		}
		if err := x.Validate(); !errors.Is(err, ErrInvalidIndex) || !strings.Contains(err.Error(), "bdnvol's own") {
			t.Errorf("%s: got %v, want a refusal of the reserved name", p, err)
		}
	}
	x := validIndex()
	x.Files[1].Path = "d/x.bdnvol-"
	x.Files[1], x.Files[2] = x.Files[2], x.Files[1]
	if err := x.Validate(); err != nil {
		t.Errorf("a name with the prefix inside it is refused: %v", err)
	}
}

// TestWalkSkipsReservedNames: what an interrupted pull left is not pushed.
func TestWalkSkipsReservedNames(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, map[string][]byte{"a": []byte("a"), ".bdnvol-pull/0123.part": []byte("partial"), "d/.bdnvol-x.part": nil})
	es, err := Walk(root)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Path)
	}
	if strings.Join(got, ",") != "a,d" {
		t.Fatalf("walked %q", got)
	}
}

// TestWalkFollowsRootSymlink: a root given as a symlink to a directory is
// that directory (symlinks inside are still not followed).
func TestWalkFollowsRootSymlink(t *testing.T) {
	base := t.TempDir()
	writeTree(t, filepath.Join(base, "real"), map[string][]byte{"a": []byte("a"), "d/b": []byte("b")})
	if err := os.Symlink("real", filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("d", filepath.Join(base, "real", "dl")); err != nil {
		t.Fatal(err)
	}
	es, err := Walk(filepath.Join(base, "link"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Path+":"+e.Type)
	}
	if strings.Join(got, ",") != "a:file,d:dir,d/b:file,dl:symlink" {
		t.Fatalf("walked %q", got)
	}
}

// TestDecodeIndexCanonical: an index is accepted only in its one encoding.
func TestDecodeIndexCanonical(t *testing.T) {
	x := validIndex()
	x.Files[1].Path = "d/<a&b>\u2028é"
	good, err := x.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeIndex(good); err != nil {
		t.Fatalf("the canonical encoding is refused: %v", err)
	}
	s := string(good)
	for name, bad := range map[string]string{
		"duplicate key":   strings.Replace(s, `"files":[`, `"files":[],"files":[`, 1),
		"key case":        strings.Replace(s, `"files"`, `"Files"`, 1),
		"whitespace":      strings.Replace(s, `"version":1`, `"version": 1`, 1),
		"trailing space":  s + " ",
		"newline":         s + "\n",
		"escaped letter":  strings.Replace(s, `"path":"d"`, `"path":"\u0064"`, 1),
		"escaped html":    strings.Replace(s, `<a&b>`, `\u003ca\u0026b\u003e`, 1),
		"exponent":        strings.Replace(s, `"mode":493`, `"mode":4.93e2`, 1),
		"explicit zero":   strings.Replace(s, `"mode":493}`, `"mode":493,"size":0}`, 1),
		"fields reversed": strings.Replace(s, `{"path":"d","type":"dir","mode":493}`, `{"mode":493,"type":"dir","path":"d"}`, 1),
	} {
		if bad == s {
			t.Fatalf("%s: the mutation did nothing", name)
		}
		if _, err := DecodeIndex([]byte(bad)); !errors.Is(err, ErrInvalidIndex) {
			t.Errorf("%s: got %v, want ErrInvalidIndex", name, err)
		}
	}
	// Not UTF-8: encoding/json would write U+FFFD, another name.
	x = validIndex()
	x.Files[1].Path = "d/\xff"
	if err := x.Validate(); err == nil {
		t.Error("a path that is not UTF-8 is accepted")
	}
	x = validIndex()
	x.Files[2].Target = "\xff"
	if err := x.Validate(); err == nil || !strings.Contains(err.Error(), "target") {
		t.Errorf("a symlink target that is not UTF-8 is accepted: %v", err)
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
	data := randBytes(21, 300<<10)
	store, v := pushed(t, Params{Min: 8 << 10, Avg: 32 << 10, Max: 64 << 10}, map[string][]byte{"d/f.bin": data, "small": []byte("s")})
	if v.NumChunks() < 4 {
		t.Fatalf("premise: several chunks, got %d", v.NumChunks())
	}
	dst := t.TempDir()
	var big File
	for _, f := range v.Index.AllFiles() {
		if f.Path == "d/f.bin" {
			big = f
		}
	}
	last := v.Index.ChunkDigest(big.Extents[len(big.Extents)-1].Chunk)
	if _, err := Pull(ctx, failing{store, last}, v, dst, PullOptions{Jobs: 1}); err == nil {
		t.Fatal("pull with a missing chunk succeeded")
	}
	if _, err := os.Stat(filepath.Join(dst, pullDirName, tmpName("d/f.bin"))); err != nil {
		t.Fatalf("no temporary file left to resume from: %v", err)
	}
	res, err := Pull(ctx, store, v, dst, PullOptions{Jobs: 1})
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
	x := &Index{Version: 1, Chunking: v1Params}
	f := File{Path: "big", Type: TypeFile, Mode: 0o644, Size: n * chunk, Digest: digest.FromString("big")}
	written := map[int][]byte{3: randBytes(1, chunk), 9000: randBytes(2, chunk), n - 1: randBytes(3, chunk)}
	for i := range n {
		d := digest.FromString(fmt.Sprint(i))
		if b, ok := written[i]; ok {
			d = digest.FromBytes(b)
		}
		x.Chunks = append(x.Chunks, Chunk{Digest: d, Size: chunk})
		f.Extents = append(f.Extents, Extent{i, 0, chunk})
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
	if _, err := fh.WriteAt(randBytes(4, chunk), 5*chunk); err != nil {
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
	data := randBytes(31, 300<<10)
	store, v := pushed(t, Params{Min: 8 << 10, Avg: 32 << 10, Max: 64 << 10}, map[string][]byte{"f.bin": data})
	for _, fl := range []*flaky{
		{Fetcher: store, target: v.Chunk(1).Digest, bad: 2, cut: true},
		{Fetcher: store, target: v.Chunk(2).Digest, bad: 1},
	} {
		c := &Counters{}
		if _, err := Pull(ctx, fl, v, t.TempDir(), PullOptions{Jobs: 2, Counters: c}); err != nil {
			t.Fatal(err)
		}
		if c.Processed.Load() != c.Total.Load() {
			t.Errorf("processed %d of %d bytes", c.Processed.Load(), c.Total.Load())
		}
	}
}

// TestParamsInherited: parameters below the floor are raised, ordered;
// sane ones are kept as they are (so later pushes dedup).
func TestParamsInherited(t *testing.T) {
	for in, want := range map[Params]Params{
		{64, 64, 64, 0}:                    {4 << 10, 8 << 10, 16 << 10, 0},
		{64, 1 << 20, 2 << 20, 64}:         {4 << 10, 1 << 20, 2 << 20, 4 << 10},
		{16 << 10, 64 << 10, 256 << 10, 0}: {16 << 10, 64 << 10, 256 << 10, 0},
		DefaultParams:                      DefaultParams,
		{32 << 10, 32 << 10, 32 << 10, 0}:  {32 << 10, 32 << 10, 32 << 10, 0},
	} {
		got := in.Inherited()
		if got != want || got.Validate() != nil {
			t.Errorf("%+v: got %+v, want %+v", in, got, want)
		}
	}
	// A version 1 volume's parameters gain small packs; a version 2
	// volume's are kept.
	if got := (&Index{Version: FormatVersion1, Chunking: v1Params}).InheritedParams(); got != DefaultParams {
		t.Errorf("version 1 defaults inherited as %+v", got)
	}
	if got := (&Index{Version: FormatVersion, Chunking: v1Params}).InheritedParams(); got != v1Params {
		t.Errorf("version 2 without a pack size inherited as %+v", got)
	}
}
