package lazy

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path"
	"slices"
	"sync"
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
		// Mount with the mount(2) call when allowed (root), so fusermount3
		// is needed only by unprivileged users; go-fuse falls back to it.
		DirectMount: true,
		Debug:       opt.Debug,
		Logger:      opt.Logger,
	}
	return fs.Mount(dir, NewRoot(v, opt), &fs.Options{
		MountOptions:    mo,
		EntryTimeout:    &long,
		AttrTimeout:     &long,
		NegativeTimeout: &long,
		UID:             opt.UID,
		GID:             opt.GID,
		Logger:          opt.Logger,
	})
}

// NewRoot returns the root node of a FUSE file system serving v, for
// fs.Mount or fs.NewNodeFS.
func NewRoot(v *Volume, opt MountOptions) fs.InodeEmbedder {
	return &rootNode{dirNode: dirNode{v: v, idx: -1, uid: opt.UID, gid: opt.GID}}
}

// dirNode is a directory of the volume; idx -1 is the root.
type dirNode struct {
	fs.Inode
	v        *Volume
	idx      int
	uid, gid uint32
}

var (
	_ = (fs.NodeGetattrer)((*dirNode)(nil))
	_ = (fs.NodeOpendirHandler)((*dirNode)(nil))
)

// OpendirHandle lists the directory's children, and lets the kernel keep
// the listing: the version is immutable, so a second listing of the
// directory costs no request.
func (d *dirNode) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	children := d.Children()
	entries := make([]fuse.DirEntry, 0, len(children))
	for name, ch := range children {
		entries = append(entries, fuse.DirEntry{Name: name, Mode: ch.Mode(), Ino: ch.StableAttr().Ino})
	}
	slices.SortFunc(entries, func(a, b fuse.DirEntry) int { return cmp.Compare(a.Ino, b.Ino) })
	return &dirList{entries: entries}, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, fs.OK
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
	perm := uint32(0o755)
	if d.idx >= 0 {
		perm = d.v.ver.Index.File(d.idx).Mode
	}
	out.Mode = syscall.S_IFDIR | perm
	out.Nlink = 2
	out.Uid, out.Gid = d.uid, d.gid
	return fs.OK
}

// rootNode is the mount root: it builds the tree and carries the digest.
type rootNode struct {
	dirNode
}

var (
	_ = (fs.NodeOnAdder)((*rootNode)(nil))
	_ = (fs.NodeGetxattrer)((*rootNode)(nil))
	_ = (fs.NodeListxattrer)((*rootNode)(nil))
	_ = (fs.NodeStatfser)((*rootNode)(nil))
)

// OnAdd builds the whole tree once, from the index, as persistent inodes.
// Parents sort before their children in a valid index.
func (r *rootNode) OnAdd(ctx context.Context) {
	x := r.v.ver.Index
	dirs := map[string]*fs.Inode{"": &r.Inode}
	for i := range x.Len() {
		e := x.File(i)
		dir, name := path.Split(e.Path)
		parent := dirs[path.Clean("/" + dir)[1:]]
		if parent == nil {
			continue // cannot happen in a validated index
		}
		attr := fs.StableAttr{Ino: uint64(i) + 2}
		var node fs.InodeEmbedder
		switch e.Type {
		case layout.TypeDir:
			attr.Mode = syscall.S_IFDIR
			node = &dirNode{v: r.v, idx: i, uid: r.uid, gid: r.gid}
		case layout.TypeSymlink:
			attr.Mode = syscall.S_IFLNK
			node = &fs.MemSymlink{Data: []byte(e.Target), Attr: fuse.Attr{Mode: syscall.S_IFLNK | 0o777, Size: uint64(len(e.Target)), Owner: fuse.Owner{Uid: r.uid, Gid: r.gid}}}
		case layout.TypeFile:
			f, err := r.v.File(i)
			if err != nil {
				continue
			}
			attr.Mode = syscall.S_IFREG
			node = &fileNode{f: f, mode: e.Mode, uid: r.uid, gid: r.gid}
		default:
			continue
		}
		ch := parent.NewPersistentInode(ctx, node, attr)
		parent.AddChild(name, ch, true)
		if e.Type == layout.TypeDir {
			dirs[e.Path] = ch
		}
	}
}

func (r *rootNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if attr != XattrDigest {
		return 0, fs.ENOATTR
	}
	val := r.v.Root().Digest.String()
	if len(dest) < len(val) {
		return uint32(len(val)), syscall.ERANGE
	}
	return uint32(copy(dest, val)), fs.OK
}

func (r *rootNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	list := XattrDigest + "\x00"
	if len(dest) < len(list) {
		return uint32(len(list)), syscall.ERANGE
	}
	return uint32(copy(dest, list)), fs.OK
}

func (r *rootNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	const bs = 4096
	out.Bsize, out.Frsize = bs, bs
	out.Blocks = uint64((r.v.ver.Index.Bytes() + bs - 1) / bs)
	out.Files = uint64(r.v.ver.Index.Len())
	out.NameLen = 255
	return fs.OK
}

// fileNode is a regular file: reads go to its File.
type fileNode struct {
	fs.Inode
	f        *File
	mode     uint32
	uid, gid uint32
}

var (
	_ = (fs.NodeGetattrer)((*fileNode)(nil))
	_ = (fs.NodeOpener)((*fileNode)(nil))
	_ = (fs.NodeReader)((*fileNode)(nil))
)

func (n *fileNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | n.mode
	out.Size = uint64(n.f.Size())
	out.Blocks = (out.Size + 511) / 512
	out.Blksize = 1 << 20
	out.Nlink = 1
	out.Uid, out.Gid = n.uid, n.gid
	return fs.OK
}

func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC|syscall.O_APPEND) != 0 {
		return nil, 0, syscall.EROFS
	}
	return nil, fuse.FOPEN_KEEP_CACHE, fs.OK
}

// Read serves verified bytes or fails with EIO; never wrong bytes.
func (n *fileNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	r, err := n.f.readResult(ctx, dest, off)
	if err != nil {
		return nil, syscall.EIO
	}
	return r, fs.OK
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
		if _, edge := f.v.edgeFor(x.Chunk, f.v.ver.Index.Chunks[x.Chunk], lo, lo+int64(n)); !edge {
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
