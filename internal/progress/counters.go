package progress

import "sync/atomic"

// Counters report the progress of a push or pull; the caller reads them
// while the operation runs. All fields are updated atomically.
type Counters struct {
	Total     atomic.Int64 // bytes of the volume
	Processed atomic.Int64 // bytes hashed (push) or written (pull)
	Sent      atomic.Int64 // bytes uploaded (push) or downloaded (pull)
}
