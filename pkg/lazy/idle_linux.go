package lazy

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// idleThread locks the calling goroutine to its thread and sets that
// thread's scheduling class to SCHED_IDLE: it runs when a CPU would
// otherwise be idle, so a backing file made in the background takes no
// CPU a start's fetches, reads and loader need. The goroutine must not
// unlock the thread: the thread ends with the goroutine, its class with it.
func idleThread() error {
	runtime.LockOSThread()
	return unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0)
}
