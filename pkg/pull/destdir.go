package pull

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/internal/beneath"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// pullDirName is the private directory, inside the directory a pull writes
// to, that holds the pull's temporary files.
const pullDirName = layout.ReservedPrefix + "pull"

// ErrUnsafeDestination is wrapped when something in the directory a pull
// writes to would make it write elsewhere (a symlink or a hard link where it
// writes), or a pull's private directory is not private.
var ErrUnsafeDestination = errors.New("unsafe destination")

// destDir is the directory a pull writes into. Every path under it is
// resolved from a descriptor of it, never through a symlink.
type destDir struct {
	root    int    // descriptor of the directory
	path    string // the directory, for messages
	rootDev uint64
	res     beneath.Resolver // opens paths under root, never through a symlink

	mu   sync.Mutex
	tmps map[uint64]*tmpDir // by device, so that a rename never crosses file systems

	filesHashed atomic.Int64 // files at their final names read whole to check their digests
}

// tmpDir is a private directory (mode 0700, owned by this user) that holds
// temporary files. Only this user (and root) can create names in it, so
// names in it can be opened again safely.
type tmpDir struct {
	fd     int
	dev    uint64 // the device it is on
	parent string // slash path under the destination of its parent directory
	name   string
	shared bool   // the fixed name, kept after a failure so a re-run resumes
	full   string // its path, for messages
	// names it held when opened: what an interrupted pull left (read
	// once, so a file with no leftover costs no lookup)
	names map[string]bool
}

func (t *tmpDir) rel() string { return path.Join(t.parent, t.name) }

// openDest opens (creating it if missing) the directory dir as a pull's
// destination. dir itself is the user's choice and may be a symlink.
func openDest(dir string) (*destDir, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	return &destDir{root: fd, path: dir, rootDev: uint64(st.Dev), tmps: map[uint64]*tmpDir{}}, nil
}

// close releases the descriptors. With ok (the pull succeeded) the
// temporary directories are emptied and removed; otherwise the shared ones
// stay, with what an interrupted pull can reuse.
func (d *destDir) close(ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, t := range d.tmps {
		if ok || !t.shared {
			d.removeTmpDir(t)
		}
		unix.Close(t.fd)
	}
	d.tmps = nil
	unix.Close(d.root)
}

// removeTmpDir removes the regular files and symlinks in t, then t. A
// directory someone made in it stays, and so does t.
func (d *destDir) removeTmpDir(t *tmpDir) {
	dup, err := unix.Dup(t.fd)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(dup), d.full(t.rel()))
	names, _ := f.Readdirnames(-1)
	f.Close()
	for _, n := range names {
		_ = unix.Unlinkat(t.fd, n, 0)
	}
	if pfd, err := d.openDir(t.parent); err == nil {
		_ = unix.Unlinkat(pfd, t.name, unix.AT_REMOVEDIR)
		unix.Close(pfd)
	}
}

// full returns the path of rel (slash-separated, under the destination) for
// messages.
func (d *destDir) full(rel string) string {
	return filepath.Join(d.path, filepath.FromSlash(rel))
}

// openDir opens the directory rel under the destination for use as a
// directory descriptor, refusing symlinks anywhere on the way.
func (d *destDir) openDir(rel string) (int, error) {
	if rel == "" {
		fd, err := unix.Openat(d.root, ".", beneath.DirFlags, 0)
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: d.path, Err: err}
		}
		return fd, nil
	}
	fd, err := d.res.Open(d.root, rel, beneath.DirFlags)
	if err != nil {
		if beneath.Unsafe(err) {
			err = fmt.Errorf("%w: a symlink or a file is in the path (%v)", ErrUnsafeDestination, err)
		}
		return -1, &os.PathError{Op: "open", Path: d.full(rel), Err: err}
	}
	return fd, nil
}

// statKey returns the stat key of the regular file at rel, looked at
// without following symlinks; false if it is not one.
func (d *destDir) statKey(rel string) (statcache.Key, bool) {
	pfd, err := d.openDir(parentOf(rel))
	if err != nil {
		return statcache.Key{}, false
	}
	defer unix.Close(pfd)
	st, ok, err := lstatAt(pfd, path.Base(rel))
	if err != nil || !ok || !isRegular(&st) {
		return statcache.Key{}, false
	}
	return unixStatKey(&st), true
}

// lstatAt returns what is at name in the directory dfd, not following a
// symlink; ok is false when nothing is there.
func lstatAt(dfd int, name string) (st unix.Stat_t, ok bool, err error) {
	err = unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return st, false, nil
	}
	return st, err == nil, err
}

func isDir(st *unix.Stat_t) bool     { return st.Mode&unix.S_IFMT == unix.S_IFDIR }
func isRegular(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFREG }
func isSymlink(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFLNK }

// ensureDir makes rel a real directory that this user can fill, replacing
// a file or a symlink in its place (never following it). made reports
// that it made the directory (empty, then).
func (d *destDir) ensureDir(rel string) (made bool, err error) {
	pfd, err := d.openDir(parentOf(rel))
	if err != nil {
		return false, err
	}
	defer unix.Close(pfd)
	base := path.Base(rel)
	st, ok, err := lstatAt(pfd, base)
	switch {
	case err != nil:
		return false, &os.PathError{Op: "lstat", Path: d.full(rel), Err: err}
	case ok && isDir(&st):
		if st.Mode&0o700 != 0o700 {
			return false, d.chmodDirAt(pfd, rel, (uint32(st.Mode)&0o777)|0o700)
		}
		return false, nil
	case ok:
		if err := unix.Unlinkat(pfd, base, 0); err != nil {
			return false, &os.PathError{Op: "remove", Path: d.full(rel), Err: err}
		}
	}
	if err := unix.Mkdirat(pfd, base, 0o755); err != nil {
		return false, &os.PathError{Op: "mkdir", Path: d.full(rel), Err: err}
	}
	return true, nil
}

// chmodDir sets the permission bits of the directory rel.
func (d *destDir) chmodDir(rel string, mode uint32) error {
	pfd, err := d.openDir(parentOf(rel))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return d.chmodDirAt(pfd, rel, mode)
}

// chmodDirAt sets the mode of the directory named path.Base(rel) in pfd,
// through a descriptor of it: a symlink put in its place is not followed.
func (d *destDir) chmodDirAt(pfd int, rel string, mode uint32) error {
	fd, err := unix.Openat(pfd, path.Base(rel), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err == nil {
		err = unix.Fchmod(fd, mode)
		unix.Close(fd)
	} else if errors.Is(err, unix.EACCES) {
		err = chmodNoRead(pfd, path.Base(rel), mode) // a directory we may not read
	}
	if err != nil {
		return &os.PathError{Op: "chmod", Path: d.full(rel), Err: err}
	}
	return nil
}

// ensureSymlink makes rel a symlink to target, replacing what is there
// (never following it); a directory in its place is an error.
func (d *destDir) ensureSymlink(rel, target string) error {
	pfd, err := d.openDir(parentOf(rel))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	base := path.Base(rel)
	st, ok, err := lstatAt(pfd, base)
	if err != nil {
		return &os.PathError{Op: "lstat", Path: d.full(rel), Err: err}
	}
	if ok {
		if isSymlink(&st) {
			if cur, err := beneath.Readlink(pfd, base, layout.MaxTargetBytes); err == nil && cur == target {
				return nil
			}
		}
		if isDir(&st) {
			return fmt.Errorf("%s: a directory is in the place of a symlink", d.full(rel))
		}
		if err := unix.Unlinkat(pfd, base, 0); err != nil {
			return &os.PathError{Op: "remove", Path: d.full(rel), Err: err}
		}
	}
	if err := unix.Symlinkat(target, pfd, base); err != nil {
		return &os.PathError{Op: "symlink", Path: d.full(rel), Err: err}
	}
	return nil
}

// tmpFor returns the temporary directory for files of the directory pfd
// (whose path is parent, on the device dev): the one of DIR, or, where parent is on another
// file system (a mount point under DIR), one in parent.
func (d *destDir) tmpFor(pfd int, dev uint64, parent string) (*tmpDir, error) {
	if dev == d.rootDev {
		pfd, parent = d.root, ""
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if t := d.tmps[dev]; t != nil {
		return t, nil
	}
	t, err := d.makeTmpDir(pfd, parent)
	if err != nil {
		return nil, err
	}
	d.tmps[dev] = t
	return t, nil
}

// makeTmpDir opens the private directory .bdnvol-pull in pfd, creating it
// (mode 0700) if missing, and locks it against a concurrent pull. If the
// name holds something else (not a directory, not this user's, open to
// others) a fresh directory with a random name is made instead.
func (d *destDir) makeTmpDir(pfd int, parent string) (*tmpDir, error) {
	if t, err := d.openPrivate(pfd, parent, pullDirName, true); err == nil || errors.Is(err, errPullRunning) {
		return t, err
	}
	var rnd [8]byte
	if _, err := io.ReadFull(rand.Reader, rnd[:]); err != nil {
		return nil, err
	}
	name := pullDirName + "-" + hex.EncodeToString(rnd[:])
	if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
		return nil, &os.PathError{Op: "mkdir", Path: d.full(path.Join(parent, name)), Err: err}
	}
	t, err := d.openPrivate(pfd, parent, name, false)
	if err != nil {
		return nil, err
	}
	return t, nil
}

var errPullRunning = errors.New("another pull into this directory is running")

func (d *destDir) openPrivate(pfd int, parent, name string, shared bool) (*tmpDir, error) {
	rel := path.Join(parent, name)
	if shared {
		if st, ok, err := lstatAt(pfd, name); err == nil && ok && !isDir(&st) {
			// Not ours to use, but a name reserved to bdnvol: a file or
			// symlink there is removed (not followed).
			_ = unix.Unlinkat(pfd, name, 0)
		}
		if err := unix.Mkdirat(pfd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, &os.PathError{Op: "mkdir", Path: d.full(rel), Err: err}
		}
	}
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: d.full(rel), Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: d.full(rel), Err: err}
	}
	if !isDir(&st) || int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w: not a private directory of this user (mode %o, owner %d)", d.full(rel), ErrUnsafeDestination, st.Mode&0o7777, st.Uid)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", d.full(rel), errPullRunning)
		}
		return nil, &os.PathError{Op: "lock", Path: d.full(rel), Err: err}
	}
	t := &tmpDir{fd: fd, dev: uint64(st.Dev), parent: parent, name: name, shared: shared, full: d.full(rel)}
	if shared {
		// A descriptor of its own: reading moves the offset.
		dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			unix.Close(fd)
			return nil, &os.PathError{Op: "open", Path: t.full, Err: err}
		}
		dh := os.NewFile(uintptr(dup), t.full)
		names, err := dh.Readdirnames(-1)
		dh.Close()
		if err != nil {
			unix.Close(fd)
			return nil, &os.PathError{Op: "readdir", Path: t.full, Err: err}
		}
		t.names = make(map[string]bool, len(names))
		for _, n := range names {
			t.names[n] = true
		}
	}
	return t, nil
}

// isEmpty reports whether the destination holds nothing but bdnvol's own
// names.
func (d *destDir) isEmpty() bool {
	fd, err := unix.Openat(d.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	for {
		names, err := f.Readdirnames(64)
		for _, n := range names {
			if !strings.HasPrefix(n, layout.ReservedPrefix) {
				return false
			}
		}
		if err != nil {
			return err == io.EOF
		}
	}
}
