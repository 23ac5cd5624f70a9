package csi

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bdnvol/bdnvol/pkg/mounts"
)

// DefaultKubeletDir is where kubelet keeps pods' volumes unless told
// otherwise; target paths must lie beneath it.
const DefaultKubeletDir = "/var/lib/kubelet"

// unsafeTargetError is a target path the plugin refuses to publish at.
type unsafeTargetError struct{ path, why string }

func (e *unsafeTargetError) Error() string { return fmt.Sprintf("target %s: %s", e.path, e.why) }

func unsafeTarget(tp, why string) error { return &unsafeTargetError{tp, why} }

// beneathDir reports whether p lies strictly beneath dir (both clean).
func beneathDir(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}

// checkTargetPath refuses, with InvalidArgument, a target path that is not
// a clean absolute path beneath the kubelet directory, or that lies in the
// mounter's own mounts directory.
func (n *Node) checkTargetPath(tp string) error {
	switch {
	case !filepath.IsAbs(tp) || filepath.Clean(tp) != tp:
		return targetStatus(unsafeTarget(tp, "not a clean absolute path"))
	case !beneathDir(n.opt.KubeletDir, tp):
		return targetStatus(unsafeTarget(tp, "not beneath the kubelet directory "+n.opt.KubeletDir))
	case n.opt.MountsDir != "" && (tp == n.opt.MountsDir || beneathDir(n.opt.MountsDir, tp)):
		return targetStatus(unsafeTarget(tp, "in the mounter's own mounts directory"))
	}
	return nil
}

// checkTarget refuses, before anything is fetched, a target that cannot be
// published: see targetDir.check.
func (n *Node) checkTarget(tp string) error {
	d, err := openTarget(n.opt.KubeletDir, tp)
	if err != nil {
		return targetStatus(err)
	}
	defer d.Close()
	return targetStatus(d.check())
}

// targetStatus is err as a gRPC status: InvalidArgument for a refused
// target, Internal otherwise.
func targetStatus(err error) error {
	var ue *unsafeTargetError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ue):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// cleanDir is dir cleaned, "" kept.
func cleanDir(dir string) string {
	if dir == "" {
		return ""
	}
	return filepath.Clean(dir)
}

// unbindTarget undoes the publish of recorded target t: it unmounts the
// bind of t's digest there (not another mount put on top) and removes the
// directory when it is empty; a path now reached through a symlink, or a
// file there, is left alone.
func (n *Node) unbindTarget(t target) error {
	d, err := openTarget(n.opt.KubeletDir, t.Path)
	var ue *unsafeTargetError
	if errors.As(err, &ue) {
		n.log.Warn("recorded target no longer safe to touch; left as it is", "target", t.Path, "error", err.Error())
		return nil
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	defer d.Close()
	if m, mounted := mounts.At(t.Path); mounted && m.Digest == t.Digest {
		if err := d.unbind(); err != nil {
			return err
		}
	} else if mounted {
		n.log.Warn("recorded target holds another mount; left as it is", "target", t.Path, "digest", m.Digest)
		return nil
	}
	return d.rmdir(true)
}

// maxStacked bounds how many dead mounts clearDead removes from one target.
const maxStacked = 8

// clearDead detaches the bdnvol mounts at target path tp whose server is
// gone (a mounter killed or crashed: every access answers ENOTCONN), so
// that the target can be published again. A live mount, another file
// system, or a path reached through a symlink is left alone.
func (n *Node) clearDead(tp string) error {
	for range maxStacked { // binds may be stacked
		if _, ok := mounts.At(tp); !ok {
			return nil
		}
		d, err := openTarget(n.opt.KubeletDir, tp)
		if err != nil {
			return targetStatus(err)
		}
		if !mounts.NotConnected(d.at()) {
			d.Close()
			return nil
		}
		err = d.unbind()
		d.Close()
		if err != nil {
			return status.Errorf(codes.Internal, "dead mount at %s: %v", tp, err)
		}
		n.log.Info("removed a dead mount: its mounter is gone", "target", tp)
	}
	return status.Errorf(codes.Internal, "%s: more than %d dead mounts stacked", tp, maxStacked)
}

// checkHeldMount refuses a mount that came over the fd protocol (from a
// predecessor, or put in or listed by the fd holder) whose mountpoint is
// not a directory directly in mountsDir, or whose key is not its
// reference's: serving it, or detaching it when it cannot be served, would
// act on a path outside the mounter's own mounts.
func checkHeldMount(h heldMount, mountsDir string) error {
	switch {
	case mountsDir == "" || !filepath.IsAbs(mountsDir):
		return fmt.Errorf("%w: mount %s: no mounts directory to confine it to", errFDProto, h.String())
	case filepath.Dir(h.Mountpoint) != filepath.Clean(mountsDir):
		return fmt.Errorf("%w: mount %s: not in the mounts directory %s", errFDProto, h.String(), mountsDir)
	case keyOfPinned(h.Ref) != h.Key:
		return fmt.Errorf("%w: mount %s: its key is not its reference's (%s)", errFDProto, h.String(), h.Ref)
	}
	return nil
}

// The device numbers of /dev/fuse on Linux (the misc major, FUSE's minor).
const (
	fuseMajor = 10
	fuseMinor = 229
)

// checkFUSE refuses a descriptor that is not an open /dev/fuse (a pipe, a
// file, another device): only a FUSE connection's master descriptor may be
// held, served or handed over. The descriptor's mode is left as it is.
func checkFUSE(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("%w: descriptor: %v", errFDProto, err)
	}
	var st unix.Stat_t
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Fstat(int(fd), &st) }); err != nil {
		return fmt.Errorf("%w: descriptor: %v", errFDProto, err)
	}
	if serr != nil {
		return fmt.Errorf("%w: descriptor: fstat: %v", errFDProto, serr)
	}
	rdev := uint64(st.Rdev)
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(rdev) != fuseMajor || unix.Minor(rdev) != fuseMinor {
		return fmt.Errorf("%w: the descriptor is not /dev/fuse (mode %#o, device %d:%d)", errFDProto, st.Mode&unix.S_IFMT, unix.Major(rdev), unix.Minor(rdev))
	}
	return nil
}
