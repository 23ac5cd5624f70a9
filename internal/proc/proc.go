// Package proc tells whether a process is alive, and which process a PID
// names, from kill(2) and /proc.
package proc

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Start returns an identifier of when process pid started ("" when
// unknown), to tell it from a later process that reuses the PID.
func Start(pid int) string {
	s := stat(pid)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19] // field 22: starttime, in clock ticks since boot
}

// Alive reports whether process pid runs and, when start is not "", is the
// process that started then (see Start). A zombie is not alive. Without
// /proc, kill(pid, 0) decides.
func Alive(pid int, start string) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	s := stat(pid)
	if s == "" {
		return true
	}
	// A killed process nobody has reaped yet is a zombie: gone for us.
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && (s[i+2] == 'Z' || s[i+2] == 'X') {
		return false
	}
	return start == "" || Start(pid) == start
}

// stat is /proc/PID/stat, or "" when it cannot be read.
func stat(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	return string(b)
}
