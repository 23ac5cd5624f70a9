package pull

import (
	"os"

	"golang.org/x/sys/unix"
)

// Descriptors. A pull holds, besides what the process held when it
// started, at most fdsSpare descriptors of its own (the destination, its
// private directory, the stat cache, the registry connections of the
// manifest and index) and fdsPerJob for each job of each of its two
// groups, fetches and local copies (a connection or a source file, a
// directory, a temporary file written whole, and the temporary files of a
// chunk's targets, openFiles). Its jobs are lowered, down to one, so that
// the whole fits under the process's RLIMIT_NOFILE: a pull under `ulimit
// -n 256` runs with fewer jobs rather than failing or retrying on EMFILE.

// fdsPerJob bounds the descriptors one transfer job holds at once.
const fdsPerJob = 3 + maxOpenPerChunk

// fdsSpare bounds the descriptors a pull holds outside its jobs.
const fdsSpare = 12

// fdBound returns the most descriptors a pull with jobs jobs holds beyond
// those open when it started.
func fdBound(jobs int) int { return fdsSpare + 2*jobs*fdsPerJob }

// jobsForLimit returns jobs lowered (not below 1) so that a pull's
// descriptors, fdBound, fit beside the open ones under limit.
func jobsForLimit(jobs int, open, limit uint64) int {
	if limit == unix.RLIM_INFINITY || limit > 1<<30 {
		return jobs
	}
	free := int64(limit) - int64(open) - fdsSpare
	fit := int(free / (2 * fdsPerJob))
	return max(1, min(jobs, fit))
}

// fdLimit returns the process's soft RLIMIT_NOFILE and how many
// descriptors are open now (0 where /proc is unavailable), or ok false
// when the limit cannot be read.
func fdLimit() (open, limit uint64, ok bool) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, 0, false
	}
	if des, err := os.ReadDir("/proc/self/fd"); err == nil {
		open = uint64(len(des))
	}
	return open, rl.Cur, true
}

// fitJobs returns jobs lowered to what the process's RLIMIT_NOFILE allows
// (jobsForLimit).
func fitJobs(jobs int) int {
	open, limit, ok := fdLimit()
	if !ok {
		return jobs
	}
	return jobsForLimit(jobs, open, limit)
}
