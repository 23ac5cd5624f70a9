package chunkcache

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// sealXattr marks a cache entry whose bytes were hashed against its name:
// it holds the entry's size and modification time at that moment. Another
// process opening the entry trusts it without hashing it again while both
// still match; any write to the file changes its mtime and voids the mark.
// The mark also names the boot it was made in: after a power loss or a
// reboot, bytes the kernel had not yet written out may be gone or torn
// under an unchanged size and time, so every entry is hashed again on its
// first use after a boot. Where extended attributes are unsupported every
// process hashes entries on first use, as before.
const sealXattr = "user.bdnvol.verified"

// bootID names the running boot (empty where the kernel does not say).
var bootID = readBootID()

func readBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func sealValue(fi os.FileInfo) string {
	return fmt.Sprintf("%d:%d:%s", fi.Size(), fi.ModTime().UnixNano(), bootID)
}

// sealEntry records that the entry at p was just verified.
func sealEntry(p string) {
	fi, err := os.Stat(p)
	if err != nil {
		return
	}
	_ = unix.Setxattr(p, sealXattr, []byte(sealValue(fi)), 0)
}

// sealedEntry reports whether f (with stat st) carries a valid mark.
func sealedEntry(f *os.File, st os.FileInfo) bool {
	buf := make([]byte, 64)
	n, err := unix.Fgetxattr(int(f.Fd()), sealXattr, buf)
	return err == nil && string(buf[:n]) == sealValue(st)
}
