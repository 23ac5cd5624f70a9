package lazy

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/push"
)

// treeFixture pushes a tree whose names stress the directory ranges of
// the index: siblings that sort between a directory and its children
// ("a-b", "a.txt" against "a/…"), nested and empty directories, and a
// symbolic link.
func treeFixture(t *testing.T) (*fixture, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	files := map[string][]byte{
		"a-b":           []byte("dash"),
		"a.txt":         []byte("dot"),
		"a/x":           randBytes(3, 70<<10),
		"a/y/z":         []byte("deep"),
		"a/y0":          []byte("after y"),
		"a0":            {},
		"b/1/2/3/4.bin": randBytes(4, 5000),
		"b/big":         randBytes(5, 300<<10),
	}
	dirs := []string{"a", "a/y", "b", "b/1", "b/1/2", "b/1/2/3", "empty"}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, b := range files {
		if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(p)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../a/y/z", filepath.Join(dir, "b/link")); err != nil {
		t.Fatal(err)
	}
	store := memory.New()
	res, err := push.Push(context.Background(), store, push.DirSource(dir), push.Options{Params: testParams})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{"b/link": "link"}
	for p := range files {
		kinds[p] = "file"
	}
	for _, d := range dirs {
		kinds[d] = "dir"
	}
	return &fixture{files: files, store: store, root: res.Root,
		fetch: &fakeFetcher{src: store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}}, kinds
}

// needFUSE skips the test where FUSE cannot be mounted, and fails it
// instead under CI=true.
func needFUSE(t *testing.T) {
	t.Helper()
	var why string
	if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "no /dev/fuse"
	} else if _, err := exec.LookPath("fusermount3"); err != nil && os.Geteuid() != 0 {
		why = "fusermount3 is not installed and not root"
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("FUSE is unusable under CI=true: %s", why)
	}
	t.Skipf("FUSE is unusable: %s", why)
}

func TestMountListsLooksUpAndReadsOnDemand(t *testing.T) {
	needFUSE(t)
	fx, kinds := treeFixture(t)
	v := fx.open(t, t.TempDir(), Options{})
	mnt := t.TempDir()
	srv, err := Mount(mnt, v, MountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })

	// Every directory lists its own children, in index (byte) order.
	seen := map[string]string{}
	var walk func(rel string)
	walk = func(rel string) {
		d, err := os.Open(filepath.Join(mnt, rel))
		if err != nil {
			t.Fatal(err)
		}
		ents, err := d.ReadDir(-1)
		d.Close()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
			p := strings.TrimPrefix(rel+"/"+e.Name(), "/")
			switch e.Type() {
			case fs.ModeDir:
				seen[p] = "dir"
				walk(p)
			case fs.ModeSymlink:
				seen[p] = "link"
			case 0:
				seen[p] = "file"
			default:
				t.Errorf("%s: type %v", p, e.Type())
			}
		}
		if !sort.StringsAreSorted(names) {
			t.Errorf("%q lists %q, not in order", rel, names)
		}
	}
	walk("")
	if len(seen) != len(kinds) {
		t.Errorf("listed %d entries, want %d: %v", len(seen), len(kinds), seen)
	}
	for p, k := range kinds {
		if seen[p] != k {
			t.Errorf("%s listed as %q, want %q", p, seen[p], k)
		}
	}

	// Lookups, attributes and reads.
	for p, want := range fx.files {
		full := filepath.Join(mnt, filepath.FromSlash(p))
		st, err := os.Stat(full)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != int64(len(want)) || st.Mode().Perm() != 0o644 {
			t.Errorf("%s: size %d mode %v, want %d 0644", p, st.Size(), st.Mode(), len(want))
		}
		got, err := os.ReadFile(full)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: read %d bytes that differ from the %d pushed", p, len(got), len(want))
		}
	}
	if target, err := os.Readlink(filepath.Join(mnt, "b/link")); err != nil || target != "../a/y/z" {
		t.Errorf("readlink b/link = %q, %v", target, err)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "b/link")); err != nil || string(b) != "deep" {
		t.Errorf("read through b/link = %q, %v", b, err)
	}
	for _, p := range []string{"a/nope", "nope", "a/y/z/under-a-file", "a-b/x", "b/1/2/3/4"} {
		if _, err := os.Stat(filepath.Join(mnt, p)); !os.IsNotExist(err) && !errorsIs(err, syscall.ENOTDIR) {
			t.Errorf("stat %s: %v, want not found", p, err)
		}
	}
	if err := os.WriteFile(filepath.Join(mnt, "a/x"), nil, 0o644); err == nil {
		t.Error("writing a/x succeeded on a read-only mount")
	}
}

func errorsIs(err error, target syscall.Errno) bool {
	var pe *fs.PathError
	if e, ok := err.(*fs.PathError); ok {
		pe = e
	}
	return pe != nil && pe.Err == target
}

// rawFS drives the node tree as the kernel would, without a mount.
type rawFS struct {
	t  testing.TB
	fs fuse.RawFileSystem
}

func (r rawFS) lookup(parent uint64, name string) (uint64, fuse.Attr, fuse.Status) {
	var out fuse.EntryOut
	st := r.fs.Lookup(nil, &fuse.InHeader{NodeId: parent}, name, &out)
	return out.NodeId, out.Attr, st
}

func (r rawFS) mustLookup(parent uint64, name string) (uint64, fuse.Attr) {
	r.t.Helper()
	id, attr, st := r.lookup(parent, name)
	if !st.Ok() {
		r.t.Fatalf("lookup %q under %d: %v", name, parent, st)
	}
	return id, attr
}

func (r rawFS) readAll(id uint64, size int) []byte {
	r.t.Helper()
	var oo fuse.OpenOut
	if st := r.fs.Open(nil, &fuse.OpenIn{InHeader: fuse.InHeader{NodeId: id}, Flags: uint32(os.O_RDONLY)}, &oo); !st.Ok() {
		r.t.Fatalf("open %d: %v", id, st)
	}
	var out []byte
	buf := make([]byte, 64<<10)
	for off := 0; off < size; {
		res, st := r.fs.Read(nil, &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: id}, Fh: oo.Fh, Offset: uint64(off), Size: uint32(len(buf))}, buf)
		if !st.Ok() {
			r.t.Fatalf("read %d at %d: %v", id, off, st)
		}
		b, st := res.Bytes(buf)
		res.Done()
		if !st.Ok() || len(b) == 0 {
			r.t.Fatalf("read %d at %d: %d bytes, %v", id, off, len(b), st)
		}
		out = append(out, b...)
		off += len(b)
	}
	r.fs.Release(nil, &fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: id}, Fh: oo.Fh})
	return out
}

func (r rawFS) list(id uint64) []string {
	r.t.Helper()
	var oo fuse.OpenOut
	if st := r.fs.OpenDir(nil, &fuse.OpenIn{InHeader: fuse.InHeader{NodeId: id}}, &oo); !st.Ok() {
		r.t.Fatalf("opendir %d: %v", id, st)
	}
	buf := make([]byte, 1<<16)
	out := fuse.NewDirEntryList(buf, 0)
	if st := r.fs.ReadDir(nil, &fuse.ReadIn{InHeader: fuse.InHeader{NodeId: id}, Fh: oo.Fh, Size: uint32(len(buf))}, out); !st.Ok() {
		r.t.Fatalf("readdir %d: %v", id, st)
	}
	r.fs.ReleaseDir(&fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: id}, Fh: oo.Fh})
	ents, err := fuse.ParseDirEntries(out.Bytes())
	if err != nil {
		r.t.Fatalf("readdir %d: %v", id, err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name)
	}
	return names
}

func (v *Volume) liveFiles() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.files)
}

func TestNodesAreMadeOnDemandAndForgotten(t *testing.T) {
	fx, _ := treeFixture(t)
	v := fx.open(t, t.TempDir(), Options{})
	r := rawFS{t: t, fs: gofs.NewNodeFS(NewRoot(v, MountOptions{}), &gofs.Options{})}

	if got, want := r.list(1), []string{"a", "a-b", "a.txt", "a0", "b", "empty"}; !slices.Equal(got, want) {
		t.Errorf("root lists %q, want %q", got, want)
	}
	a, attr := r.mustLookup(1, "a")
	if attr.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		t.Errorf("a: mode %o, want a directory", attr.Mode)
	}
	if got, want := r.list(a), []string{"x", "y", "y0"}; !slices.Equal(got, want) {
		t.Errorf("a lists %q, want %q", got, want)
	}
	empty, _ := r.mustLookup(1, "empty")
	if got := r.list(empty); len(got) != 0 {
		t.Errorf("empty lists %q", got)
	}
	if v.liveFiles() != 0 {
		t.Fatalf("listing made %d files, want none", v.liveFiles())
	}
	for _, name := range []string{"y/z", "nope", "", "x/"} {
		if _, _, st := r.lookup(a, name); st != fuse.ENOENT && st.Ok() {
			t.Errorf("lookup %q under a: %v, want ENOENT", name, st)
		}
	}

	want := fx.files["a/x"]
	x, attr := r.mustLookup(a, "x")
	if attr.Size != uint64(len(want)) || attr.Mode != syscall.S_IFREG|0o644 {
		t.Errorf("a/x: size %d mode %o", attr.Size, attr.Mode)
	}
	if v.liveFiles() != 0 {
		t.Errorf("a lookup made %d files, want none before an open", v.liveFiles())
	}
	if got := r.readAll(x, len(want)); !bytes.Equal(got, want) {
		t.Fatalf("a/x read differs")
	}
	if v.liveFiles() != 1 {
		t.Errorf("%d files live after reading one", v.liveFiles())
	}
	// The kernel forgets the file: its File goes; a new lookup reads the
	// same bytes.
	r.fs.Forget(x, 1)
	if v.liveFiles() != 0 {
		t.Errorf("%d files live after the kernel forgot the only one", v.liveFiles())
	}
	x2, _ := r.mustLookup(a, "x")
	if got := r.readAll(x2, len(want)); !bytes.Equal(got, want) {
		t.Fatalf("a/x read after forget differs")
	}
	// Forgetting the directory as well, then looking both up again.
	r.fs.Forget(x2, 1)
	r.fs.Forget(a, 1)
	a2, _ := r.mustLookup(1, "a")
	y, _ := r.mustLookup(a2, "y")
	z, _ := r.mustLookup(y, "z")
	if got := r.readAll(z, 4); string(got) != "deep" {
		t.Errorf("a/y/z reads %q", got)
	}
	b, _ := r.mustLookup(1, "b")
	link, attr := r.mustLookup(b, "link")
	if attr.Mode&syscall.S_IFMT != syscall.S_IFLNK || attr.Size != uint64(len("../a/y/z")) {
		t.Errorf("b/link: mode %o size %d", attr.Mode, attr.Size)
	}
	if target, st := r.fs.Readlink(nil, &fuse.InHeader{NodeId: link}); !st.Ok() || string(target) != "../a/y/z" {
		t.Errorf("readlink b/link = %q, %v", target, st)
	}
}

// BenchmarkListTreeHeap lists every directory of a 100,000-file index the
// way `ls -R` does over plain READDIR (a lookup per directory, a listing
// of each) through the node tree, and reports the heap that stays: nodes
// for the directories only, not one per entry (building every node up
// front kept some 1.4 KB per entry).
func BenchmarkListTreeHeap(b *testing.B) {
	const n, perDir = 100_000, 1000
	x := &layout.Index{Version: layout.FormatVersion, Chunking: layout.DefaultParams}
	x.Chunks = []layout.Chunk{{Digest: digest.FromString("c"), Size: 1 << 10}}
	for d := 0; d*perDir < n; d++ {
		dir := fmt.Sprintf("shard-%05d", d)
		x.Files = append(x.Files, layout.File{Path: dir, Type: layout.TypeDir, Mode: 0o755})
		for i := d * perDir; i < (d+1)*perDir; i++ {
			x.Files = append(x.Files, layout.File{Path: fmt.Sprintf("%s/sample-%08d.jpg", dir, i), Type: layout.TypeFile, Mode: 0o644,
				Size: 1 << 10, Digest: digest.FromString("c"), Extents: []layout.Extent{{Chunk: 0, Offset: 0, Length: 1 << 10}}})
		}
	}
	c, err := chunkcache.Open(b.TempDir(), 0)
	if err != nil {
		b.Fatal(err)
	}
	v, err := New(&layout.Version{Index: x}, memory.New(), Options{Cache: c})
	if err != nil {
		b.Fatal(err)
	}
	defer v.Close()
	b.ResetTimer()
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r := rawFS{t: b, fs: gofs.NewNodeFS(NewRoot(v, MountOptions{}), &gofs.Options{})}
		entries := 0
		for _, name := range r.list(1) {
			id, _, st := r.lookup(1, name)
			if !st.Ok() {
				b.Fatalf("lookup %s: %v", name, st)
			}
			entries += 1 + len(r.list(id))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if entries != x.Len() {
			b.Fatalf("listed %d entries, want %d", entries, x.Len())
		}
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(entries), "kept-B/entry")
		runtime.KeepAlive(r)
	}
}
