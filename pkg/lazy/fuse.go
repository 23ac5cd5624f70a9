package lazy

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// XattrDigest names the extended attribute of the mount root that holds the
// digest of the version served.
const XattrDigest = "user.bdnvol.digest"

// FsType is the file system type a mount shows in /proc/self/mountinfo
// (as "fuse." + FsType).
const FsType = "bdnvol"

// FsNamePrefix starts the source field of a mount in /proc/self/mountinfo;
// the version's digest follows it.
const FsNamePrefix = "bdnvol@"

// MountOptions configure Mount. Zero values select defaults.
type MountOptions struct {
	AllowOther bool        // let other users read the mount (needs user_allow_other)
	UID, GID   uint32      // owner of every entry; 0 means root
	Debug      bool        // log every FUSE request to Logger
	Logger     *log.Logger // diagnostics; nil discards them
	// NoPassthrough serves every read through FUSE, never from a backing
	// file (passthrough.go).
	NoPassthrough bool

	disabledCaps     uint64 // capabilities not asked of the kernel (tests)
	forcePassthrough bool   // offer backing files even when not granted (tests)
	onFlush          func() // told of every FLUSH request (tests)
}

// Mount serves v read-only at dir and returns once the mount is ready.
// Unmount it with the server's Unmount; Wait returns when it is gone.
func Mount(dir string, v *Volume, opt MountOptions) (*fuse.Server, error) {
	long := time.Hour // the version is immutable
	mo := fuse.MountOptions{
		FsName:       FsNamePrefix + v.Root().Digest.String(),
		Name:         FsType,
		Options:      []string{"ro", "default_permissions"},
		AllowOther:   opt.AllowOther,
		MaxReadAhead: 1 << 20,
		MaxWrite:     1 << 20,
		// Plain READDIR: with READDIRPLUS the kernel looks up (and holds a
		// node for) every entry listed, a million for `ls -R` of a
		// dataset; without, only what is opened or stat'ed.
		DisableReadDirPlus: true,
		// Mount with the mount(2) call when allowed (root), so fusermount3
		// is needed only by unprivileged users; go-fuse falls back to it.
		DirectMount:          true,
		Debug:                opt.Debug,
		Logger:               opt.Logger,
		DisabledCapabilities: opt.disabledCaps,
	}
	if opt.NoPassthrough {
		mo.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	root := NewRoot(v, opt).(*rootNode)
	srv, err := fs.Mount(dir, root, &fs.Options{
		MountOptions:    mo,
		EntryTimeout:    &long,
		AttrTimeout:     &long,
		NegativeTimeout: &long,
		UID:             opt.UID,
		GID:             opt.GID,
		Logger:          opt.Logger,
	})
	if err != nil {
		return nil, err
	}
	granted := srv.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH != 0 && mo.DisabledCapabilities&fuse.CAP_PASSTHROUGH == 0
	root.t.pass.Store(granted || opt.forcePassthrough)
	return srv, nil
}

// NewRoot returns the root node of a FUSE file system serving v, for
// fs.Mount or fs.NewNodeFS.
func NewRoot(v *Volume, opt MountOptions) fs.InodeEmbedder {
	t := &tree{v: v, uid: opt.UID, gid: opt.GID, onFlush: opt.onFlush}
	v.replay.mu.Lock()
	v.replay.store = t.storeLoaded
	v.replay.mu.Unlock()
	return &rootNode{dirNode: dirNode{t: t, idx: -1, mode: 0o755}}
}

// tree serves the entries of a volume as FUSE nodes made on demand: a
// node is made when the kernel looks its name up, and dropped when the
// kernel forgets it, so a mount holds nodes only for the entries in use,
// whatever the number of files.
type tree struct {
	v        *Volume
	uid, gid uint32
	pass     atomic.Bool // the kernel granted passthrough: offer backing files
	onFlush  func()      // MountOptions.onFlush
}

// ino returns the inode number of entry i (the root, -1, is 1).
func ino(i int) uint64 { return uint64(i) + 2 }

// children returns the entries under directory idx (-1: the root) as the
// range [lo, hi) of the index: in a sorted index the paths under a
// directory are contiguous, between dir+"/" and dir+"0".
func (t *tree) children(idx int) (prefix string, lo, hi int) {
	x := t.v.ver.Index
	n := x.Len()
	if idx < 0 {
		return "", 0, n
	}
	prefix = x.Path(idx) + "/"
	lo = sort.Search(n, func(i int) bool { return x.Path(i) >= prefix })
	end := prefix[:len(prefix)-1] + "0" // '0' follows '/'
	hi = lo + sort.Search(n-lo, func(i int) bool { return x.Path(lo+i) >= end })
	return prefix, lo, hi
}

// list returns the entries directly in directory idx, in index order.
// Entries inside a child directory are skipped a subtree at a time: they
// run from child+"/" to child+"0", which need not follow the child
// itself ("a", "a-b", "a/x", "a0").
func (t *tree) list(idx int) []fuse.DirEntry {
	x := t.v.ver.Index
	prefix, lo, hi := t.children(idx)
	var out []fuse.DirEntry
	for i := lo; i < hi; {
		name := x.Path(i)[len(prefix):]
		if k := strings.IndexByte(name, '/'); k >= 0 {
			end := prefix + name[:k] + "0"
			i += sort.Search(hi-i, func(j int) bool { return x.Path(i+j) >= end })
			continue
		}
		e := fuse.DirEntry{Name: name, Ino: ino(i), Mode: syscall.S_IFREG}
		switch x.Kind(i) {
		case layout.TypeDir:
			e.Mode = syscall.S_IFDIR
		case layout.TypeSymlink:
			e.Mode = syscall.S_IFLNK
		}
		out = append(out, e)
		i++
	}
	return out
}

// node returns a new node for entry i, and fills out with its attributes.
func (t *tree) node(i int, out *fuse.Attr) (fs.InodeEmbedder, fs.StableAttr) {
	e := t.v.ver.Index.File(i)
	attr := fs.StableAttr{Ino: ino(i)}
	var node fs.InodeEmbedder
	switch e.Type {
	case layout.TypeDir:
		attr.Mode = syscall.S_IFDIR
		d := &dirNode{t: t, idx: i, mode: e.Mode}
		d.attr(out)
		node = d
	case layout.TypeSymlink:
		attr.Mode = syscall.S_IFLNK
		l := &linkNode{t: t, idx: i, size: uint32(len(e.Target))}
		l.attr(out)
		node = l
	default:
		attr.Mode = syscall.S_IFREG
		f := &fileNode{t: t, idx: i, mode: e.Mode, size: e.Size}
		f.attr(out)
		node = f
	}
	return node, attr
}

// dirNode is a directory of the volume; idx -1 is the root.
type dirNode struct {
	fs.Inode
	t    *tree
	idx  int
	mode uint32
}

var (
	_ = (fs.NodeGetattrer)((*dirNode)(nil))
	_ = (fs.NodeLookuper)((*dirNode)(nil))
	_ = (fs.NodeOpendirHandler)((*dirNode)(nil))
)

// Lookup finds name in the directory by binary search in the index, and
// returns a node for it that lives while the kernel holds it.
func (d *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p := name
	if d.idx >= 0 {
		p = d.t.v.ver.Index.Path(d.idx) + "/" + name
	}
	i, ok := d.t.v.ver.Index.Find(p)
	if !ok || strings.Contains(name, "/") {
		return nil, syscall.ENOENT
	}
	node, attr := d.t.node(i, &out.Attr)
	return d.NewInode(ctx, node, attr), fs.OK
}

// OpendirHandle lists the directory's children, and lets the kernel keep
// the listing: the version is immutable, so a second listing of the
// directory costs no request.
func (d *dirNode) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return &dirList{entries: d.t.list(d.idx)}, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, fs.OK
}

// dirList is an open directory: its entries, in index order, and how many
// were read.
type dirList struct {
	mu      sync.Mutex
	entries []fuse.DirEntry
	pos     int
}

var (
	_ = (fs.FileReaddirenter)((*dirList)(nil))
	_ = (fs.FileSeekdirer)((*dirList)(nil))
)

// Readdirent returns the next entry, or nil at the end.
func (l *dirList) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pos >= len(l.entries) {
		return nil, fs.OK
	}
	e := l.entries[l.pos]
	l.pos++
	e.Off = uint64(l.pos)
	return &e, fs.OK
}

// Seekdir goes back (or on) to just after the off-th entry.
func (l *dirList) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pos = int(min(off, uint64(len(l.entries))))
	return fs.OK
}

func (d *dirNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.attr(&out.Attr)
	return fs.OK
}

func (d *dirNode) attr(out *fuse.Attr) {
	out.Mode = syscall.S_IFDIR | d.mode
	out.Nlink = 2
	out.Ino = ino(d.idx)
	out.Uid, out.Gid = d.t.uid, d.t.gid
}

// linkNode is a symbolic link; its target is read from the index.
type linkNode struct {
	fs.Inode
	t    *tree
	idx  int
	size uint32
}

var (
	_ = (fs.NodeGetattrer)((*linkNode)(nil))
	_ = (fs.NodeReadlinker)((*linkNode)(nil))
)

func (l *linkNode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	return []byte(l.t.v.ver.Index.File(l.idx).Target), fs.OK
}

func (l *linkNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	l.attr(&out.Attr)
	return fs.OK
}

func (l *linkNode) attr(out *fuse.Attr) {
	out.Mode = syscall.S_IFLNK | 0o777
	out.Size = uint64(l.size)
	out.Nlink = 1
	out.Ino = ino(l.idx)
	out.Uid, out.Gid = l.t.uid, l.t.gid
}

// rootNode is the mount root: it carries the digest.
type rootNode struct {
	dirNode
}

var (
	_ = (fs.NodeGetxattrer)((*rootNode)(nil))
	_ = (fs.NodeListxattrer)((*rootNode)(nil))
	_ = (fs.NodeStatfser)((*rootNode)(nil))
)

func (r *rootNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	var val string
	switch attr {
	case XattrDigest:
		val = r.t.v.Root().Digest.String()
	case XattrFUSEReads:
		val = strconv.FormatInt(r.t.v.reads.Load(), 10)
	default:
		return 0, fs.ENOATTR
	}
	if len(dest) < len(val) {
		return uint32(len(val)), syscall.ERANGE
	}
	return uint32(copy(dest, val)), fs.OK
}

func (r *rootNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	list := XattrDigest + "\x00" + XattrFUSEReads + "\x00"
	if len(dest) < len(list) {
		return uint32(len(list)), syscall.ERANGE
	}
	return uint32(copy(dest, list)), fs.OK
}

func (r *rootNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	const bs = 4096
	out.Bsize, out.Frsize = bs, bs
	out.Blocks = uint64((r.t.v.ver.Index.Bytes() + bs - 1) / bs)
	out.Files = uint64(r.t.v.ver.Index.Len())
	out.NameLen = 255
	return fs.OK
}

// fileNode is a regular file: reads go to its File, made when the file is
// first opened and dropped from the volume when the kernel forgets the
// node.
type fileNode struct {
	fs.Inode
	t    *tree
	idx  int
	mode uint32
	size int64
	f    atomic.Pointer[File]

	open  openState    // opens through FUSE and passthrough (passthrough.go)
	reads atomic.Int64 // FUSE READ requests served
}

var (
	_ = (fs.NodeGetattrer)((*fileNode)(nil))
	_ = (fs.NodeOpener)((*fileNode)(nil))
	_ = (fs.NodeReader)((*fileNode)(nil))
	_ = (fs.NodeOnForgetter)((*fileNode)(nil))
	_ = (fs.NodeGetxattrer)((*fileNode)(nil))
	_ = (fs.NodeFlusher)((*fileNode)(nil))
)

func (n *fileNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.attr(&out.Attr)
	return fs.OK
}

func (n *fileNode) attr(out *fuse.Attr) {
	out.Mode = syscall.S_IFREG | n.mode
	out.Size = uint64(n.size)
	out.Blocks = (out.Size + 511) / 512
	out.Blksize = 1 << 20
	out.Nlink = 1
	out.Ino = ino(n.idx)
	out.Uid, out.Gid = n.t.uid, n.t.gid
}

// file returns the node's File, making it on first use.
func (n *fileNode) file() (*File, error) {
	if f := n.f.Load(); f != nil {
		return f, nil
	}
	f, err := n.t.v.File(n.idx)
	if err != nil {
		return nil, err
	}
	if !n.f.CompareAndSwap(nil, f) {
		return n.f.Load(), nil
	}
	return f, nil
}

func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC|syscall.O_APPEND) != 0 {
		return nil, 0, syscall.EROFS
	}
	if _, err := n.file(); err != nil {
		return nil, 0, syscall.EIO
	}
	h, fl := n.openHandle()
	return h, fl, fs.OK
}

// Flush answers the FLUSH the kernel sends on every close(2) with ENOSYS,
// which tells the kernel the file system does not use it: it sends none
// again for this mount, and a close costs one round trip (RELEASE) instead
// of two. Nothing here needs it: the file system is read-only and a close
// has nothing to write back or report.
func (n *fileNode) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno {
	if n.t.onFlush != nil {
		n.t.onFlush()
	}
	return syscall.ENOSYS
}

// Read serves verified bytes or fails with EIO; never wrong bytes.
func (n *fileNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n.reads.Add(1)
	n.t.v.reads.Add(1)
	f, err := n.file()
	if err != nil {
		return nil, syscall.EIO
	}
	r, err := f.readResult(ctx, dest, off)
	if err != nil {
		return nil, syscall.EIO
	}
	return r, fs.OK
}

// OnForget lets the volume drop the node's File once the kernel no
// longer holds the node.
func (n *fileNode) OnForget() {
	if f := n.f.Load(); f != nil {
		n.t.v.dropFile(n.idx, f)
	}
}

// dropFile forgets File f of entry i, unless another took its place.
func (v *Volume) dropFile(i int, f *File) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.files[i] == f {
		delete(v.files, i)
	}
}

// readResult answers a FUSE read of len(dest) bytes at off. A read inside
// one chunk stored in the cache is answered with the entry's descriptor,
// which go-fuse splices to the kernel without copying the bytes through
// this process; other reads are copied into dest.
func (f *File) readResult(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, error) {
	n, first, err := f.start(ctx, off, len(dest), true)
	if err == io.EOF {
		return fuse.ReadResultData(nil), nil
	}
	if err != nil {
		return nil, err
	}
	x := f.e.Extents[first]
	within := off - f.starts[first]
	lo := x.Offset + within
	if int64(n) <= x.Length-within {
		if _, edge := f.v.edgeFor(x.Chunk, f.v.ver.Index.Chunk(x.Chunk), lo, lo+int64(n)); !edge {
			h, err := f.v.chunk(ctx, x.Chunk)
			if err != nil {
				return nil, fmt.Errorf("%s at %d: %w", f.e.Path, off, err)
			}
			if file, ok := h.ch.(*os.File); ok {
				return &chunkRead{fd: file.Fd(), off: lo, size: n, release: func() { f.v.release(h) }}, nil
			}
			f.v.release(h)
		}
	}
	m, err := f.copyOut(ctx, dest[:n], off, first)
	if err != nil {
		return nil, err
	}
	return fuse.ReadResultData(dest[:m]), nil
}

// chunkRead is a FUSE read answered from a verified cache entry. It holds
// the entry open until go-fuse has sent the bytes (Done).
type chunkRead struct {
	fd      uintptr
	off     int64
	size    int
	once    sync.Once
	release func()
}

// Seekable lets go-fuse splice the bytes from the entry's descriptor.
func (r *chunkRead) Seekable() (uintptr, int64, int) { return r.fd, r.off, r.size }

// Bytes reads the bytes, where splicing is not available.
func (r *chunkRead) Bytes(buf []byte) ([]byte, fuse.Status) {
	if cap(buf) < r.size {
		buf = make([]byte, r.size)
	}
	buf = buf[:r.size]
	for done := 0; done < r.size; {
		k, err := syscall.Pread(int(r.fd), buf[done:], r.off+int64(done))
		if err != nil {
			return nil, fuse.ToStatus(err)
		}
		if k == 0 {
			return nil, fuse.EIO
		}
		done += k
	}
	return buf, fuse.OK
}

// Size returns the length of the read.
func (r *chunkRead) Size() int { return r.size }

// Done releases the entry.
func (r *chunkRead) Done() { r.once.Do(r.release) }
