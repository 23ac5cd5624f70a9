//go:build unix

package signature

import "syscall"

// openFlags open a key file without waiting (a FIFO's open waits for a
// writer) and without making a terminal the controlling one.
const openFlags = syscall.O_NONBLOCK | syscall.O_NOCTTY
