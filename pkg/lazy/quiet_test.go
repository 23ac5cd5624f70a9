package lazy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestWaitQuietWaitsForFetchesToPause: a background assembly does not start
// while a chunk fetch is in flight or new ones start, starts once fetching
// has paused, waits for reads to pause and files open through FUSE to
// close only up to assemblyMaxWait, and
// gives up when the volume closes.
func TestWaitQuietWaitsForFetchesToPause(t *testing.T) {
	defer func(d, m time.Duration) { assemblyQuiet, assemblyMaxWait = d, m }(assemblyQuiet, assemblyMaxWait)
	assemblyQuiet = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	v := &Volume{bg: ctx}

	v.fetching.Store(1) // a fetch in flight
	done := make(chan bool, 1)
	go func() { done <- v.waitQuiet() }()
	select {
	case <-done:
		t.Fatal("waitQuiet returned while a fetch was in flight")
	case <-time.After(10 * assemblyQuiet):
	}
	v.fetching.Store(0)
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("waitQuiet gave up on an open volume")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waitQuiet did not return once fetching paused")
	}

	// Reads without pause hold it back until assemblyMaxWait.
	assemblyMaxWait = 100 * time.Millisecond
	stopReads := keepAdding(&v.reads)
	start := time.Now()
	if !v.waitQuiet() {
		t.Fatal("waitQuiet gave up on an open volume")
	}
	stopReads()
	if took := time.Since(start); took < assemblyMaxWait {
		t.Fatalf("waitQuiet returned after %v of reads, before assemblyMaxWait", took)
	}

	// So does a file open through FUSE (its reader may read only the
	// page cache): until it closes, or up to assemblyMaxWait.
	v.replay.open = map[int]*fileNode{0: nil}
	assemblyMaxWait = time.Hour
	go func() { done <- v.waitQuiet() }()
	select {
	case <-done:
		t.Fatal("waitQuiet returned while a file was open through FUSE")
	case <-time.After(10 * assemblyQuiet):
	}
	v.replay.mu.Lock()
	delete(v.replay.open, 0)
	v.replay.mu.Unlock()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("waitQuiet gave up on an open volume")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waitQuiet did not return once the file was closed")
	}
	v.replay.mu.Lock()
	v.replay.open[1] = nil
	v.replay.mu.Unlock()
	assemblyMaxWait = 100 * time.Millisecond
	start = time.Now()
	if !v.waitQuiet() {
		t.Fatal("waitQuiet gave up on an open volume")
	}
	if took := time.Since(start); took < assemblyMaxWait {
		t.Fatalf("waitQuiet returned after %v with a file open, before assemblyMaxWait", took)
	}
	v.replay.open = nil
	assemblyMaxWait = time.Hour

	// Fetches starting one after another (none in flight at a tick) keep
	// it waiting too; closing the volume ends the wait.
	assemblyQuiet = 200 * time.Millisecond // a loaded machine may hold the fetcher back a while
	stop := keepAdding(&v.fetches)
	go func() { done <- v.waitQuiet() }()
	select {
	case <-done:
		t.Fatal("waitQuiet returned while fetches kept starting")
	case <-time.After(5 * assemblyQuiet):
	}
	cancel()
	stop()
	select {
	case ok := <-done:
		if ok {
			t.Fatal("waitQuiet reported quiet for a closed volume")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waitQuiet did not return when the volume closed")
	}
}

// keepAdding adds 1 to n every millisecond until the returned stop is
// called.
func keepAdding(n *atomic.Int64) (stop func()) {
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			default:
				n.Add(1)
				time.Sleep(time.Millisecond)
			}
		}
	}()
	return func() { close(done) }
}
