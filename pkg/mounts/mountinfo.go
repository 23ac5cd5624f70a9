package mounts

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/bdnvol/bdnvol/pkg/lazy"
)

// Mount is a bdnvol FUSE mount, or a bind mount of one, in the mount table.
type Mount struct {
	Mountpoint string
	Digest     string // the digest of the version served
}

// mountinfoPath is the mount table of this process's mount namespace.
const mountinfoPath = "/proc/self/mountinfo"

// ParseMountinfo returns the bdnvol mounts listed in r, a file in the
// format of /proc/self/mountinfo.
func ParseMountinfo(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, fl := range fields {
			if fl == "-" && i >= 6 {
				sep = i
				break
			}
		}
		if sep < 0 || sep+2 >= len(fields) {
			continue
		}
		if fields[sep+1] != "fuse."+lazy.FsType {
			continue
		}
		out = append(out, Mount{
			Mountpoint: unescape(fields[4]),
			Digest:     strings.TrimPrefix(unescape(fields[sep+2]), lazy.FsNamePrefix),
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mount table: %w", err)
	}
	return out, nil
}

// unescape decodes the \ooo escapes of mountinfo fields.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// List returns the bdnvol mounts visible to this process.
func List() ([]Mount, error) {
	f, err := os.Open(mountinfoPath)
	if err != nil {
		return nil, fmt.Errorf("mount table: %w", err)
	}
	defer f.Close()
	return ParseMountinfo(f)
}

// At returns the bdnvol mount at mp, if any.
func At(mp string) (Mount, bool) {
	ms, _ := List()
	for _, m := range ms {
		if m.Mountpoint == mp {
			return m, true
		}
	}
	return Mount{}, false
}

// Under lists the bdnvol mounts strictly under dir.
func Under(dir string) ([]Mount, error) {
	ms, err := List()
	if err != nil {
		return nil, err
	}
	var under []Mount
	for _, m := range ms {
		if strings.HasPrefix(m.Mountpoint, dir+string(filepath.Separator)) {
			under = append(under, m)
		}
	}
	return under, nil
}

// ServedBy counts the bdnvol mounts whose state in s names process pid.
func (s Store) ServedBy(pid int) int {
	ms, err := List()
	if err != nil {
		return 0
	}
	n := 0
	for _, m := range ms {
		if st, ok := s.Read(m.Mountpoint); ok && st.PID == pid {
			n++
		}
	}
	return n
}
