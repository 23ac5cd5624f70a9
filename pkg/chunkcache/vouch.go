package chunkcache

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// A vouch is the mark this file writes and checks: an entry's bytes were
// verified (hashed against its name) and are unchanged since. It is not a
// seal, which in bdnvol is the sealing of a version.

// vouchXattr marks a cache entry whose bytes were hashed against its name:
// it holds the entry's size and modification time at that moment. Another
// process opening the entry trusts it without hashing it again while both
// still match; any write to the file changes its mtime and voids the mark.
// Where extended attributes are unsupported every process hashes entries
// on first use, as before.
const vouchXattr = "user.bdnvol.verified"

// bootID names the running boot (empty where the kernel does not say).
// A mark names the boot it was made in: after a power loss or a reboot,
// bytes the kernel had not yet written out may be gone or torn under an
// unchanged size and time, so every entry is hashed again on its first
// use after a boot.
var bootID = readBootID()

func readBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// vouchValue is the mark of an entry with stat fi: its size and mtime, and
// the boot.
func vouchValue(fi os.FileInfo) string {
	return fmt.Sprintf("%d:%d:%s", fi.Size(), fi.ModTime().UnixNano(), bootID)
}

// vouchEntry vouches for the entry at p, just verified.
func vouchEntry(p string) {
	fi, err := os.Stat(p)
	if err != nil {
		return
	}
	_ = unix.Setxattr(p, vouchXattr, []byte(vouchValue(fi)), 0)
}

// vouchedEntry reports whether f (with stat st) carries a valid mark.
func vouchedEntry(f *os.File, st os.FileInfo) bool {
	// size (up to 19 digits) : mtime in ns (19) : boot id (36), and room
	buf := make([]byte, 128)
	n, err := unix.Fgetxattr(int(f.Fd()), vouchXattr, buf)
	return err == nil && string(buf[:n]) == vouchValue(st)
}
