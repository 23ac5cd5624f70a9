package lazy

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// raiseReadahead sets the kernel's readahead for the FUSE mount at dir to
// at least bytes. The kernel takes the smaller of the readahead the
// server asks for at INIT and its default for a new FUSE mount (128 KiB),
// and cuts each read of the page cache into requests no larger than the
// readahead: a loader's read of an 8 MiB tensor would reach the server
// as 64 requests of 128 KiB, each a round trip through the server, where
// bytes/1 MiB of them do. It needs the right to write the mount's
// /sys/class/bdi entry (root); the mount works without it.
func raiseReadahead(dir string, bytes int) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("readahead of %s: %w", dir, err)
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	want := bytes >> 10
	if b, err := os.ReadFile(p); err == nil {
		if cur, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && cur >= want {
			return nil
		}
	}
	if err := os.WriteFile(p, []byte(strconv.Itoa(want)), 0); err != nil {
		return fmt.Errorf("readahead of %s: %w", dir, err)
	}
	return nil
}
