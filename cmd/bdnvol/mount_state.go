package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bdnvol/bdnvol/pkg/lazy"
)

// mountState is what a running mount records about itself, so that
// `bdnvol mounts` and `bdnvol umount` can find its reference and process.
type mountState struct {
	Mountpoint string    `json:"mountpoint"`
	Reference  string    `json:"reference"`
	Digest     string    `json:"digest"`
	PID        int       `json:"pid"`
	CacheDir   string    `json:"cache_dir"`
	Started    time.Time `json:"started"`
}

// stateDir is where mounts record their state: $XDG_RUNTIME_DIR/bdnvol/mounts,
// else mounts/ under the cache directory.
func (g *Globals) stateDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "bdnvol", "mounts")
	}
	return filepath.Join(g.cacheDir(), "mounts")
}

func stateKey(mp string) string {
	h := sha256.Sum256([]byte(mp))
	return hex.EncodeToString(h[:8])
}

func (g *Globals) statePath(mp string) string {
	return filepath.Join(g.stateDir(), stateKey(mp)+".json")
}

func (g *Globals) writeState(s mountState) error {
	if err := os.MkdirAll(g.stateDir(), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	p := g.statePath(s.Mountpoint)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

func (g *Globals) readState(mp string) (mountState, bool) {
	var s mountState
	b, err := os.ReadFile(g.statePath(mp))
	if err != nil || json.Unmarshal(b, &s) != nil || s.Mountpoint != mp {
		return s, false
	}
	return s, true
}

// removeState removes the state of mp if it belongs to pid (0: any).
func (g *Globals) removeState(mp string, pid int) {
	if s, ok := g.readState(mp); ok && (pid == 0 || s.PID == pid) {
		os.Remove(g.statePath(mp))
	}
}

// fuseMount is a bdnvol mount listed in /proc/self/mountinfo.
type fuseMount struct {
	Mountpoint string
	Digest     string
}

// bdnvolMounts lists the bdnvol FUSE mounts visible to this process.
func bdnvolMounts() ([]fuseMount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []fuseMount
	sc := bufio.NewScanner(f)
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
		if sep < 0 || sep+2 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fields[sep+1] != "fuse."+lazy.FsType {
			continue
		}
		out = append(out, fuseMount{
			Mountpoint: unescapeMountinfo(fields[4]),
			Digest:     strings.TrimPrefix(unescapeMountinfo(fields[sep+2]), lazy.FsNamePrefix),
		})
	}
	return out, sc.Err()
}

// unescapeMountinfo decodes the \ooo escapes of mountinfo fields.
func unescapeMountinfo(s string) string {
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

// mountedAt returns the bdnvol mount at mp, if any.
func mountedAt(mp string) (fuseMount, bool) {
	ms, _ := bdnvolMounts()
	for _, m := range ms {
		if m.Mountpoint == mp {
			return m, true
		}
	}
	return fuseMount{}, false
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	// A killed process nobody has reaped yet is a zombie: gone for us.
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

// detach unmounts mp lazily: it disappears now, and the kernel lets go of
// it when the last open file is closed.
func detach(mp string) error {
	if err := syscall.Unmount(mp, mntDetach); err == nil {
		return nil
	}
	var last error
	for _, tool := range []string{"fusermount3", "fusermount"} {
		out, err := exec.Command(tool, "-u", "-z", mp).CombinedOutput()
		if err == nil {
			return nil
		}
		last = errors.New(strings.TrimSpace(string(out)))
		if len(out) == 0 {
			last = err
		}
	}
	return last
}

// unmountFUSE unmounts mp, failing when it is busy: with umount(2) when
// allowed (root), else with fusermount3.
func unmountFUSE(mp string) error {
	err := syscall.Unmount(mp, 0)
	if err == nil || !errors.Is(err, syscall.EPERM) {
		return err
	}
	for _, tool := range []string{"fusermount3", "fusermount"} {
		out, ferr := exec.Command(tool, "-u", mp).CombinedOutput()
		if ferr == nil {
			return nil
		}
		if len(out) > 0 {
			err = errors.New(strings.TrimSpace(string(out)))
		}
	}
	return err
}

// mountsUnder lists the bdnvol mounts strictly under dir.
func mountsUnder(dir string) ([]fuseMount, error) {
	ms, err := bdnvolMounts()
	if err != nil {
		return nil, err
	}
	var under []fuseMount
	for _, m := range ms {
		if strings.HasPrefix(m.Mountpoint, dir+string(filepath.Separator)) {
			under = append(under, m)
		}
	}
	return under, nil
}

// servedBy counts the live bdnvol mounts whose recorded process is pid.
func (g *Globals) servedBy(pid int) int {
	ms, err := bdnvolMounts()
	if err != nil {
		return 0
	}
	n := 0
	for _, m := range ms {
		if st, ok := g.readState(m.Mountpoint); ok && st.PID == pid {
			n++
		}
	}
	return n
}

// isNotConnected reports whether mp is a FUSE mount whose server is gone.
// statfs always reaches the server (stat may be answered from the kernel's
// attribute cache).
func isNotConnected(mp string) bool {
	var st syscall.Statfs_t
	err := syscall.Statfs(mp, &st)
	return errors.Is(err, syscall.ENOTCONN)
}
