package lazy

import (
	"context"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// handoffFS serves a volume over the raw FUSE protocol with no per-kernel
// state: a node id is the entry's inode number (ino), every file handle is
// 0, and a directory listing is recomputed from its offset. Any process
// that opens the same version can therefore answer any request the kernel
// sends on a mount another process served first (see Conn): this is what
// lets a mount change hands.
type handoffFS struct {
	fuse.RawFileSystem // ENOSYS for everything not served here
	t                  *tree
}

// entryTimeout is how long the kernel may keep names and attributes: the
// version is immutable.
const entryTimeout = time.Hour

// newHandoffFS returns the stateless raw file system of v.
func newHandoffFS(v *Volume, uid, gid uint32) *handoffFS {
	return &handoffFS{RawFileSystem: fuse.NewDefaultRawFileSystem(), t: &tree{v: v, uid: uid, gid: gid}}
}

// entry maps a node id to an index entry: -1 is the root; ok is false for
// ids that name nothing in this version.
func (r *handoffFS) entry(node uint64) (int, bool) {
	if node == fuse.FUSE_ROOT_ID {
		return -1, true
	}
	i := int(node) - 2
	if node < 2 || i >= r.t.v.ver.Index.Len() {
		return 0, false
	}
	return i, true
}

func (r *handoffFS) String() string { return "bdnvol" }

// attr fills out with the attributes of entry i (-1: the root).
func (r *handoffFS) attr(i int, out *fuse.Attr) {
	if i < 0 {
		(&dirNode{t: r.t, idx: -1, mode: 0o755}).attr(out)
		return
	}
	r.t.node(i, out)
}

// Lookup finds name in directory header.NodeId.
func (r *handoffFS) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	d, ok := r.entry(header.NodeId)
	if !ok || (d >= 0 && r.t.v.ver.Index.Kind(d) != layout.TypeDir) {
		return fuse.ENOTDIR
	}
	p := name
	if d >= 0 {
		p = r.t.v.ver.Index.Path(d) + "/" + name
	}
	i, found := r.t.v.ver.Index.Find(p)
	if !found || strings.Contains(name, "/") {
		// A negative entry the kernel may keep: the version never changes.
		out.NodeId = 0
		out.SetEntryTimeout(entryTimeout)
		return fuse.OK
	}
	out.NodeId = ino(i)
	r.attr(i, &out.Attr)
	out.SetEntryTimeout(entryTimeout)
	out.SetAttrTimeout(entryTimeout)
	return fuse.OK
}

// Forget needs nothing: no node is held.
func (r *handoffFS) Forget(nodeid, nlookup uint64) {}

// GetAttr returns the attributes of a node.
func (r *handoffFS) GetAttr(cancel <-chan struct{}, input *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	i, ok := r.entry(input.NodeId)
	if !ok {
		return fuse.ENOENT
	}
	r.attr(i, &out.Attr)
	out.SetTimeout(entryTimeout)
	return fuse.OK
}

// Open opens a regular file read-only; its handle is 0.
func (r *handoffFS) Open(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if input.Flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC|syscall.O_APPEND) != 0 {
		return fuse.EROFS
	}
	i, ok := r.entry(input.NodeId)
	if !ok || i < 0 {
		return fuse.EISDIR
	}
	if _, err := r.t.v.File(i); err != nil {
		return fuse.EIO
	}
	out.Fh = 0
	out.OpenFlags = fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH
	return fuse.OK
}

// Read serves verified bytes of the file input.NodeId, or EIO; never
// wrong bytes.
func (r *handoffFS) Read(cancel <-chan struct{}, input *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	i, ok := r.entry(input.NodeId)
	if !ok || i < 0 {
		return nil, fuse.EIO
	}
	f, err := r.t.v.File(i)
	if err != nil {
		return nil, fuse.EIO
	}
	ctx, stop := cancelContext(cancel)
	defer stop()
	size := min(int(input.Size), len(buf))
	n, err := f.ReadAtContext(ctx, buf[:size], int64(input.Offset))
	if err != nil && err != io.EOF {
		return nil, fuse.EIO
	}
	return fuse.ReadResultData(buf[:n]), fuse.OK
}

// cancelContext is a context ended when cancel is closed (the kernel
// interrupted the request).
func cancelContext(cancel <-chan struct{}) (context.Context, func()) {
	ctx, stop := context.WithCancel(context.Background())
	if cancel != nil {
		go func() {
			select {
			case <-cancel:
				stop()
			case <-ctx.Done():
			}
		}()
	}
	return ctx, stop
}

// Release needs nothing: handles hold nothing.
func (r *handoffFS) Release(cancel <-chan struct{}, input *fuse.ReleaseIn) {}

// Flush is not served (ENOSYS, from the embedded default): the kernel
// then sends no FLUSH again on this connection, so a close() never waits
// for a server, even while no process serves the mount (a handoff).

// OpenDir opens a directory, letting the kernel keep its listing.
func (r *handoffFS) OpenDir(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	i, ok := r.entry(input.NodeId)
	if !ok || (i >= 0 && r.t.v.ver.Index.Kind(i) != layout.TypeDir) {
		return fuse.ENOTDIR
	}
	out.Fh = 0
	out.OpenFlags = fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE
	return fuse.OK
}

// ReadDir lists a directory from input.Offset, the number of entries
// already returned.
func (r *handoffFS) ReadDir(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	i, ok := r.entry(input.NodeId)
	if !ok {
		return fuse.ENOTDIR
	}
	entries := r.t.list(i)
	for k := int(min(input.Offset, uint64(len(entries)))); k < len(entries); k++ {
		e := entries[k]
		e.Off = uint64(k + 1)
		if !out.AddDirEntry(e) {
			break
		}
	}
	return fuse.OK
}

// ReleaseDir needs nothing.
func (r *handoffFS) ReleaseDir(input *fuse.ReleaseIn) {}

// Readlink returns a symbolic link's target.
func (r *handoffFS) Readlink(cancel <-chan struct{}, header *fuse.InHeader) ([]byte, fuse.Status) {
	i, ok := r.entry(header.NodeId)
	if !ok || i < 0 || r.t.v.ver.Index.Kind(i) != layout.TypeSymlink {
		return nil, fuse.EINVAL
	}
	return []byte(r.t.v.ver.Index.File(i).Target), fuse.OK
}

// GetXAttr serves the root's digest attribute (XattrDigest).
func (r *handoffFS) GetXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	if header.NodeId != fuse.FUSE_ROOT_ID || attr != XattrDigest {
		return 0, fuse.ENOATTR
	}
	val := r.t.v.Root().Digest.String()
	if len(dest) < len(val) {
		return uint32(len(val)), fuse.ERANGE
	}
	return uint32(copy(dest, val)), fuse.OK
}

// ListXAttr lists the root's digest attribute.
func (r *handoffFS) ListXAttr(cancel <-chan struct{}, header *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	if header.NodeId != fuse.FUSE_ROOT_ID {
		return 0, fuse.OK
	}
	list := XattrDigest + "\x00"
	if len(dest) < len(list) {
		return uint32(len(list)), fuse.ERANGE
	}
	return uint32(copy(dest, list)), fuse.OK
}

// StatFs describes the volume.
func (r *handoffFS) StatFs(cancel <-chan struct{}, input *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	const bs = 4096
	out.Bsize, out.Frsize = bs, bs
	out.Blocks = uint64((r.t.v.ver.Index.Bytes() + bs - 1) / bs)
	out.Files = uint64(r.t.v.ver.Index.Len())
	out.NameLen = 255
	return fuse.OK
}
