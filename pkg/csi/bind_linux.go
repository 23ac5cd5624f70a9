package csi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/internal/beneath"
)

// targetDir is a target path opened beneath the kubelet directory: the
// descriptor of its parent, reached without following a symlink, and its
// name there. Everything done at the target goes through the descriptor,
// so a path swapped meanwhile (a symlink) cannot redirect it.
type targetDir struct {
	path   string // as kubelet gave it
	parent int
	name   string
}

var resolver beneath.Resolver

// openTarget opens the parent of tp, which must lie beneath kubeletDir
// (see checkTargetPath), without following symlinks.
func openTarget(kubeletDir, tp string) (*targetDir, error) {
	rel, err := filepath.Rel(kubeletDir, filepath.Dir(tp))
	if err != nil {
		return nil, unsafeTarget(tp, "not beneath the kubelet directory")
	}
	root, err := unix.Open(kubeletDir, beneath.DirFlags, 0)
	if err != nil {
		return nil, fmt.Errorf("kubelet directory %s: %w", kubeletDir, err)
	}
	parent := root
	if rel != "." {
		parent, err = resolver.Open(root, filepath.ToSlash(rel), beneath.DirFlags)
		unix.Close(root)
		if beneath.Unsafe(err) {
			return nil, unsafeTarget(tp, "a symlink or a file on the way")
		}
		if err != nil {
			return nil, fmt.Errorf("target %s: parent: %w", tp, err)
		}
	}
	return &targetDir{path: tp, parent: parent, name: filepath.Base(tp)}, nil
}

func (d *targetDir) Close() { unix.Close(d.parent) }

// at is the target as a path through the parent's descriptor.
func (d *targetDir) at() string { return fmt.Sprintf("/proc/self/fd/%d/%s", d.parent, d.name) }

// check reports whether the target can be published: missing, or an empty
// directory; a symlink, a file or a non-empty directory is refused.
func (d *targetDir) check() error {
	var st unix.Stat_t
	err := unix.Fstatat(d.parent, d.name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("target %s: %w", d.path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unsafeTarget(d.path, "not a directory (a symlink or a file)")
	}
	fd, err := unix.Openat(d.parent, d.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return unsafeTarget(d.path, "not a directory that can be opened")
	}
	defer unix.Close(fd)
	names, err := beneath.Names(fd, d.path)
	if err != nil {
		return fmt.Errorf("target %s: %w", d.path, err)
	}
	if len(names) > 0 {
		return unsafeTarget(d.path, "a directory that is not empty")
	}
	return nil
}

// bind makes the target an empty directory (created says whether it made
// it) and binds src there read-only, through the directory's descriptor.
func (d *targetDir) bind(src string) (created bool, err error) {
	if err := d.check(); err != nil {
		return false, err
	}
	if err := unix.Mkdirat(d.parent, d.name, 0o750); err == nil {
		created = true
	} else if !errors.Is(err, unix.EEXIST) {
		return false, fmt.Errorf("target %s: %w", d.path, err)
	}
	fd, err := unix.Openat(d.parent, d.name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		d.rmdir(created)
		return false, unsafeTarget(d.path, "not a directory")
	}
	defer unix.Close(fd)
	if err := bindReadOnly(src, fd); err != nil {
		d.rmdir(created)
		return false, fmt.Errorf("bind %s at %s: %w", src, d.path, err)
	}
	return created, nil
}

// bindReadOnly binds src read-only at the directory fd: a detached clone
// of src made read-only and moved there, so it is never writable; where
// the kernel lacks the new mount API, a bind and a read-only remount.
func bindReadOnly(src string, fd int) error {
	tree, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err == nil {
		defer unix.Close(tree)
		if err = unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err == nil {
			return unix.MoveMount(tree, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		}
	}
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) {
		return err
	}
	at := fmt.Sprintf("/proc/self/fd/%d", fd)
	if err := unix.Mount(src, at, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	// The remount names the new mount: the directory's descriptor is the
	// directory under it, so reopen it, which crosses into the bind.
	fd2, err := unix.Openat(fd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == nil {
		err = unix.Mount("", fmt.Sprintf("/proc/self/fd/%d", fd2), "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, "")
		unix.Close(fd2)
	}
	if err != nil {
		unix.Unmount(at, unix.MNT_DETACH)
		return fmt.Errorf("remount read-only: %w", err)
	}
	return nil
}

// unbind unmounts what is mounted at the target, detaching it lazily when
// it is busy; a symlink there is not followed.
func (d *targetDir) unbind() error {
	err := unix.Unmount(d.at(), unix.UMOUNT_NOFOLLOW)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(d.at(), unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", d.path, err)
	}
	return nil
}

// rmdir removes the target when it is an empty directory, never a file
// (nor a symlink) put there; made false does nothing.
func (d *targetDir) rmdir(made bool) error {
	if !made {
		return nil
	}
	err := unix.Unlinkat(d.parent, d.name, unix.AT_REMOVEDIR)
	if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) {
		return fmt.Errorf("remove target %s: %w", d.path, err)
	}
	return nil
}

// overlay makes the target an empty directory and mounts an overlay there
// (lower read-only, upper and work the pod's own), through the directory's
// descriptor.
func (d *targetDir) overlay(lower, upper, work string) error {
	data, err := overlayOptions(lower, upper, work)
	if err != nil {
		return err
	}
	if err := d.check(); err != nil {
		return err
	}
	created := false
	if err := unix.Mkdirat(d.parent, d.name, 0o750); err == nil {
		created = true
	} else if !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("target %s: %w", d.path, err)
	}
	fd, err := unix.Openat(d.parent, d.name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		d.rmdir(created)
		return unsafeTarget(d.path, "not a directory")
	}
	defer unix.Close(fd)
	if err := unix.Mount("overlay", fmt.Sprintf("/proc/self/fd/%d", fd), "overlay", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		d.rmdir(created)
		return fmt.Errorf("overlay at %s: %w", d.path, err)
	}
	return nil
}

// mountAt reports whether something is mounted at path p, and the file
// system type of the topmost mount there.
func mountAt(p string) (fstype string, ok bool) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, found := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if found && len(f) > 4 && len(g) > 0 && unescapeMountinfo(f[4]) == p {
			fstype, ok = g[0], true // later lines are mounted above earlier ones
		}
	}
	return fstype, ok
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
