package e2e

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// bigTree is n files of size bytes each, random.
func bigTree(seed uint64, n, size int) []node {
	var nodes []node
	for i := range n {
		nodes = append(nodes, fileNode(fmt.Sprintf("shard-%02d.bin", i), 0o644, randBytes(seed+uint64(i), size)))
	}
	return nodes
}

// checkRate fails the test unless n bytes in d are within tol of rate
// bytes per second.
func checkRate(t *testing.T, what string, n int64, d time.Duration, rate float64, lo, hi float64) {
	t.Helper()
	got := float64(n) / d.Seconds()
	t.Logf("%s: %d bytes in %v: %.1f MiB/s (cap %.0f MiB/s)", what, n, d.Round(time.Millisecond), got/(1<<20), rate/(1<<20))
	if got < lo*rate || got > hi*rate {
		t.Errorf("%s moved %.1f MiB/s, want %.0f%%..%.0f%% of %.0f MiB/s", what, got/(1<<20), lo*100, hi*100, rate/(1<<20))
	}
}

// pull --max-rate 20MiB of a 200 MB volume from a loopback registry (which
// serves it many times faster) takes its bytes over the time the cap
// allows, all eight parallel fetches together: within 10 %, and so does a
// copy of it to another registry. A push with --max-rate 10MiB of a
// smaller volume is paced as well.
func TestMaxRate(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, bigTree(900, 10, 20<<20), time.Time{})
	repo := reg.Host + "/vols/maxrate"
	push(t, repo, repo+":v1", src)

	reg.ResetStats()
	start := time.Now()
	pull(t, repo+":v1", filepath.Join(t.TempDir(), "out"), "--no-cache", "--max-rate", "20MiB")
	checkRate(t, "pull --max-rate 20MiB", reg.Stats().BlobBytesOut, time.Since(start), 20<<20, 0.9, 1.1)

	// copy streams blobs from one registry to another: the cap holds for
	// the bytes the destination receives, wall time of the whole command.
	dst := newDistribution(t)
	start = time.Now()
	r := copyJSON(t, "--max-rate", "20MiB", repo+":v1", dst.Host+"/vols/copied")
	d := time.Since(start)
	if in := dst.Stats().BlobBytesIn; r.BytesSent < 200e6 || in != r.BytesSent {
		t.Fatalf("premise: the copy sends the whole volume: sent %d, the destination received %d", r.BytesSent, in)
	}
	checkRate(t, "copy --max-rate 20MiB", dst.Stats().BlobBytesIn, d, 20<<20, 0.9, 1.1)

	small := filepath.Join(t.TempDir(), "small")
	buildTree(t, small, bigTree(950, 4, 12<<20), time.Time{})
	reg.ResetStats()
	start = time.Now()
	push(t, reg.Host+"/vols/maxrate-push", reg.Host+"/vols/maxrate-push:v1", small, "--max-rate", "10MiB")
	// Push hashes and chunks before it sends: a lower floor.
	checkRate(t, "push --max-rate 10MiB", reg.Stats().BlobBytesIn, time.Since(start), 10<<20, 0.85, 1.1)
}

// sync --max-rate 20MiB of a 100 MB S3 object bounds the bytes it reads
// from the source and sends to the registry together (docs/copy.md): 200 MB
// over the time the cap allows, within 10 %.
func TestMaxRateSync(t *testing.T) {
	backend := s3mem.New()
	if err := backend.CreateBucket("ckpt"); err != nil {
		t.Fatal(err)
	}
	body := randBytes(990, 100e6)
	if _, err := backend.PutObject("ckpt", "run/model.bin", map[string]string{}, bytes.NewReader(body), int64(len(body)), nil); err != nil {
		t.Fatal(err)
	}
	bodies := s3Endpoint(t, backend, "/ckpt/run/")
	reg := newDistribution(t)
	start := time.Now()
	mustRun(t, "sync", "--max-rate", "20MiB", "s3://ckpt/run", reg.Host+"/vols/synced:v1")
	d := time.Since(start)
	_, read := bodies.take()
	sent := reg.Stats().BlobBytesIn
	if read != int64(len(body)) || sent < int64(len(body)) {
		t.Fatalf("premise: the sync reads the object once and sends it: read %d, sent %d of %d", read, sent, len(body))
	}
	checkRate(t, "sync --max-rate 20MiB (read + sent)", read+sent, d, 20<<20, 0.9, 1.1)
}
