package e2e

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// The mounter hands its FUSE mounts over: to a successor started while it
// runs (SIGTERM afterwards), or through the fd holder after a kill -9.

var (
	altBinOnce sync.Once
	altBinPath string
	altBinErr  error
)

// altBin is the CLI built again with another version stamped in: a
// different binary, standing for an upgrade.
func altBin(t *testing.T) string {
	t.Helper()
	bin(t)
	altBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "bdnvol-alt-")
		if err != nil {
			altBinErr = err
			return
		}
		altBinPath = filepath.Join(dir, "bdnvol")
		cmd := exec.Command("go", "build", "-ldflags", "-X main.version=handoff-successor", "-o", altBinPath, "./cmd/bdnvol")
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			altBinErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if altBinErr != nil {
		t.Fatal(altBinErr)
	}
	return altBinPath
}

// startSuccessor starts a mounter from binary while the current one runs,
// and waits until it serves (it took the mounts over first). It returns
// the predecessor's process.
func (n *csiNode) startSuccessor(binary string, flags ...string) *exec.Cmd {
	n.t.Helper()
	old := n.mounter
	n.mounterLog = &syncBuffer{}
	args := []string{"csi", "mounter", "--mounts-dir", n.mountsDir, "--mounter-socket", n.mounterS,
		"--state-dir", n.stateDir, "--cache-dir", n.cacheDir, "--cache-size", n.cacheSize, "--hosts-dir", "none"}
	args = append(append(append(args, n.mounterFlags...), flags...), n.globals...)
	n.mounter = exec.Command(binary, args...)
	n.mounter.Env = cliEnv(n.t)
	n.mounter.Stdout, n.mounter.Stderr = n.mounterLog, n.mounterLog
	if err := n.mounter.Start(); err != nil {
		n.t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(n.mounterLog.String(), `"msg":"serving"`) {
		if time.Now().After(deadline) {
			n.t.Fatalf("the new mounter does not serve:\n%s", n.mounterLog)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return old
}

// stopProcess sends SIGTERM to p and waits for it to exit.
func stopProcess(t *testing.T, p *exec.Cmd, limit time.Duration) {
	t.Helper()
	if p == nil || p.Process == nil {
		return
	}
	p.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		p.Process.Kill()
		<-done
		t.Errorf("process %d did not exit within %v of SIGTERM", p.Process.Pid, limit)
	}
}

// fdHolder is a running `bdnvol csi fd-holder`.
type fdHolder struct {
	cmd    *exec.Cmd
	log    *syncBuffer
	socket string
}

// startHolder starts an fd holder for n (killed in t.Cleanup).
func (n *csiNode) startHolder(flags ...string) *fdHolder {
	n.t.Helper()
	h := &fdHolder{log: &syncBuffer{}, socket: filepath.Join(n.root, "fdholder.sock")}
	os.Remove(h.socket)
	h.cmd = exec.Command(bin(n.t), append([]string{"csi", "fd-holder", "--socket", h.socket, "--mounts-dir", n.mountsDir}, flags...)...)
	h.cmd.Env = cliEnv(n.t)
	h.cmd.Stdout, h.cmd.Stderr = h.log, h.log
	if err := h.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	waitSocket(n.t, h.socket, h.log)
	n.t.Cleanup(func() {
		if h.cmd.ProcessState == nil {
			h.cmd.Process.Kill()
			h.cmd.Wait()
		}
		if n.t.Failed() {
			n.t.Logf("fd holder log:\n%s", h.log)
		}
	})
	return h
}

// kill9 kills the holder with SIGKILL.
func (h *fdHolder) kill9(t *testing.T) {
	t.Helper()
	h.cmd.Process.Signal(syscall.SIGKILL)
	h.cmd.Wait()
}

// streamer reads every file of a tree through a pod's target, paced,
// checking each file's SHA-256 against the source; it keeps the longest
// single read and every error (retrying the read after one).
type streamer struct {
	read    atomic.Int64 // bytes read so far
	stall   atomic.Int64 // longest read, in nanoseconds
	mu      sync.Mutex
	errs    []error
	done    chan struct{}
	badHash []string
}

// stream starts reading src's files under target, chunk bytes every pace.
func stream(t *testing.T, src, target string, chunk int, pace time.Duration) *streamer {
	t.Helper()
	s := &streamer{done: make(chan struct{})}
	var files []string
	filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			rel, _ := filepath.Rel(src, p)
			files = append(files, rel)
		}
		return nil
	})
	sort.Strings(files)
	go func() {
		defer close(s.done)
		buf := make([]byte, chunk)
		for _, rel := range files {
			want, err := fileSum(filepath.Join(src, rel))
			if err != nil {
				s.fail(err)
				return
			}
			f, err := os.Open(filepath.Join(target, rel))
			if err != nil {
				s.fail(err)
				return
			}
			h := sha256.New()
			var off int64
			for {
				start := time.Now()
				k, err := f.ReadAt(buf, off)
				if took := time.Since(start); int64(took) > s.stall.Load() {
					s.stall.Store(int64(took))
				}
				h.Write(buf[:k])
				off += int64(k)
				s.read.Add(int64(k))
				if err == io.EOF {
					break
				}
				if err != nil {
					s.fail(fmt.Errorf("%s at %d: %w", rel, off, err))
					if len(s.errors()) > 20 {
						f.Close()
						return
					}
					time.Sleep(50 * time.Millisecond)
					continue // the same offset again
				}
				time.Sleep(pace)
			}
			f.Close()
			if got := h.Sum(nil); !bytes.Equal(got, want) {
				s.mu.Lock()
				s.badHash = append(s.badHash, rel)
				s.mu.Unlock()
			}
		}
	}()
	return s
}

func fileSum(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

func (s *streamer) fail(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

func (s *streamer) errors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

// waitRead waits until the streamer has read n bytes.
func (s *streamer) waitRead(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for s.read.Load() < n {
		select {
		case <-s.done:
			t.Fatalf("the reader ended after %d bytes, before %d: %v", s.read.Load(), n, s.errors())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reader read only %d bytes in 3 minutes", s.read.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// finish waits for the streamer to end (failing after limit: a hung read).
func (s *streamer) finish(t *testing.T, limit time.Duration) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(limit):
		t.Fatalf("the reader hangs: %d bytes read, %v", s.read.Load(), s.errors())
	}
	if len(s.badHash) > 0 {
		t.Errorf("files read with wrong bytes: %v", s.badHash)
	}
}

// bigVersion pushes a synthetic checkpoint of about size bytes to repo:tag.
func bigVersion(t *testing.T, repo, tag string, size int64, seed uint64) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "model")
	if err := synth.Generate(src, synth.Options{TargetBytes: size, Shards: 2, Seed: seed}); err != nil {
		t.Fatal(err)
	}
	push(t, repo, repo+":"+tag, src)
	return src
}

// TestCSIMounterHandoff streams a 1 GB version through a pod's target while
// the mounter changes hands, and checks every byte read.
//   - graceful: a mounter from a different build starts while the old one
//     runs and takes its mounts over; then the old one gets SIGTERM. The
//     reader never sees an error.
//   - kill -9 with the fd holder: the mounter is killed; a new one takes the
//     mounts from the holder. Requests in flight in the dead process fail
//     (ECONNABORTED; the reader retries), none hangs; what the reader sees
//     while no mounter runs is measured.
//   - SIGTERM with the fd holder: the mounter leaves its mounts to the
//     holder and exits; a new one started after serves them. No error.
func TestCSIMounterHandoff(t *testing.T) {
	reg := newDistribution(t)
	repo := reg.Host + "/vols/handoff"
	src := bigVersion(t, repo, "big", 1<<30, 27)
	next := altBin(t)
	const mib = 1 << 20

	t.Run("graceful", func(t *testing.T) {
		n := startCSI(t, time.Minute)
		a := n.newPod("a")
		n.mustPublish(a, repo+":big", "")
		s := stream(t, src, a.target, mib, 5*time.Millisecond)
		s.waitRead(t, 300*mib)
		start := time.Now()
		old := n.startSuccessor(next)
		took := time.Since(start)
		stopProcess(t, old, 30*time.Second)
		s.finish(t, 5*time.Minute)
		if errs := s.errors(); len(errs) > 0 {
			t.Errorf("the reader saw %d errors across the handoff: %v", len(errs), errs)
		}
		t.Logf("MEASURE graceful handoff: successor serving after %v; longest read stall %v over %d bytes",
			took.Round(time.Millisecond), time.Duration(s.stall.Load()).Round(time.Millisecond), s.read.Load())
		if !n.mounterLog.waitFor(10*time.Second, "handoff-successor", "took over from the predecessor") {
			t.Errorf("the successor's log does not show it took over:\n%s", n.mounterLog)
		}
		if ms := n.fuseMounts(); len(ms) != 1 {
			t.Errorf("FUSE mounts after the handoff: %v, want the one", ms)
		}
		// The successor serves the node plugin: a second pod shares the mount.
		b := n.newPod("b")
		n.mustPublish(b, repo+":big", "")
		if _, err := os.ReadFile(filepath.Join(b.target, "config.json")); err != nil {
			t.Error(err)
		}
	})

	t.Run("kill -9 with fd holder", func(t *testing.T) {
		n := startCSIWith(t, time.Minute, "1GiB", nil)
		h := n.startHolder()
		n.mounterFlags = []string{"--fd-holder", h.socket}
		stopProcess(t, n.mounter, 30*time.Second)
		n.startMounter()
		a := n.newPod("a")
		n.mustPublish(a, repo+":big", "")
		s := stream(t, src, a.target, mib, 5*time.Millisecond)
		s.waitRead(t, 300*mib)
		n.kill9Mounter()
		killed := time.Now()
		// With the holder and no mounter, a read of bytes not read yet
		// waits in the kernel's queue.
		probe := make(chan error, 1)
		go func() {
			f, err := os.Open(filepath.Join(a.target, "tokenizer.json"))
			if err == nil {
				_, err = io.ReadAll(f)
				f.Close()
			}
			probe <- err
		}()
		time.Sleep(2 * time.Second)
		select {
		case err := <-probe:
			t.Errorf("a read with no mounter (the holder keeping the mount) returned %v; want it to wait", err)
		default:
		}
		n.startSuccessor(next, "--fd-holder", h.socket)
		took := time.Since(killed)
		if err := <-probe; err != nil {
			t.Errorf("the read queued while no mounter ran: %v", err)
		}
		s.finish(t, 5*time.Minute)
		errs := s.errors()
		for _, err := range errs {
			if !errors.Is(err, syscall.ECONNABORTED) {
				t.Errorf("a read across the crash failed with %v; want only ECONNABORTED for requests in flight", err)
			}
		}
		t.Logf("MEASURE kill -9 via the fd holder: %d read errors (%v); successor serving %v after the kill (2s of it waiting on purpose); longest read stall %v over %d bytes",
			len(errs), errs, took.Round(time.Millisecond), time.Duration(s.stall.Load()).Round(time.Millisecond), s.read.Load())
		if !n.mounterLog.waitFor(10*time.Second, "took over from the fd holder") {
			t.Errorf("the new mounter did not take over from the holder:\n%s", n.mounterLog)
		}
	})

	t.Run("sigterm with fd holder", func(t *testing.T) {
		n := startCSIWith(t, time.Minute, "1GiB", nil)
		h := n.startHolder()
		n.mounterFlags = []string{"--fd-holder", h.socket}
		stopProcess(t, n.mounter, 30*time.Second)
		n.startMounter()
		a := n.newPod("a")
		n.mustPublish(a, repo+":big", "")
		s := stream(t, src, a.target, mib, 5*time.Millisecond)
		s.waitRead(t, 300*mib)
		stopped := time.Now()
		stopProcess(t, n.mounter, 30*time.Second)
		n.mounter = nil
		if ms := n.fuseMounts(); len(ms) != 1 {
			t.Errorf("FUSE mounts after a stop with the holder: %v, want the one kept", ms)
		}
		n.startSuccessor(next, "--fd-holder", h.socket)
		took := time.Since(stopped)
		s.finish(t, 5*time.Minute)
		if errs := s.errors(); len(errs) > 0 {
			t.Errorf("the reader saw %d errors across a stop with the holder: %v", len(errs), errs)
		}
		t.Logf("MEASURE SIGTERM with the fd holder, then a new mounter: serving %v after the stop; longest read stall %v",
			took.Round(time.Millisecond), time.Duration(s.stall.Load()).Round(time.Millisecond))
	})
}

// TestCSIMounterHandoffManyReaders: ten pods read three versions across a
// graceful handoff; none sees an error, all bytes are right.
func TestCSIMounterHandoffManyReaders(t *testing.T) {
	reg := newDistribution(t)
	repo := reg.Host + "/vols/many"
	var srcs []string
	for i := range 3 {
		srcs = append(srcs, bigVersion(t, repo, fmt.Sprintf("v%d", i), 48<<20, uint64(100+i)))
	}
	n := startCSI(t, time.Minute)
	var readers []*streamer
	for i := range 10 {
		p := n.newPod(fmt.Sprintf("p%d", i))
		n.mustPublish(p, fmt.Sprintf("%s:v%d", repo, i%3), "")
		readers = append(readers, stream(t, srcs[i%3], p.target, 256<<10, 10*time.Millisecond))
	}
	if ms := n.fuseMounts(); len(ms) != 3 {
		t.Fatalf("FUSE mounts %v, want three", ms)
	}
	for _, s := range readers {
		s.waitRead(t, 8<<20)
	}
	old := n.startSuccessor(altBin(t))
	stopProcess(t, old, 30*time.Second)
	var stall time.Duration
	for i, s := range readers {
		s.finish(t, 5*time.Minute)
		if errs := s.errors(); len(errs) > 0 {
			t.Errorf("reader %d saw errors: %v", i, errs)
		}
		stall = max(stall, time.Duration(s.stall.Load()))
	}
	t.Logf("MEASURE ten readers on three digests across a graceful handoff: longest read stall %v", stall.Round(time.Millisecond))
	if ms := n.fuseMounts(); len(ms) != 3 {
		t.Errorf("FUSE mounts after the handoff %v, want three", ms)
	}
}

// TestCSIFDHolderRestartAndStop: a holder that restarts while the mounter
// runs gets every mount again (a crash of the mounter after that still
// hands them over), and a holder stopped with no mounter detaches them:
// readers then see ENOTCONN, not a hang.
func TestCSIFDHolderRestartAndStop(t *testing.T) {
	reg := newDistribution(t)
	repo := reg.Host + "/vols/holder"
	v1, _, _ := csiVersions(t, repo)
	big, err := os.ReadFile(filepath.Join(v1, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	n := startCSIWith(t, time.Minute, "1GiB", nil)
	h := n.startHolder("--detach-after", "2s")
	n.mounterFlags = []string{"--fd-holder", h.socket}
	stopProcess(t, n.mounter, 30*time.Second)
	n.startMounter()
	a := n.newPod("a")
	n.mustPublish(a, repo+":prod", "")
	f, err := os.Open(filepath.Join(a.target, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	// Closed in the background: with the holder keeping the mount and no
	// mounter (a failed test), the kernel's FLUSH waits for a server.
	t.Cleanup(func() { go f.Close() })
	if _, err := f.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	// A close answered ENOSYS to FLUSH: the kernel sends none again, so
	// the test's closes (an exec closes its descriptors) never wait for a
	// mounter.
	waitReadable(t, filepath.Join(a.target, "readme.txt"))

	h.kill9(t)
	h2 := n.startHolder("--detach-after", "2s")
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(h2.log.String(), `"component":"fd-holder","mount"`) {
		if time.Now().After(deadline) {
			t.Fatalf("the mounter did not give its mounts to the restarted holder:\nmounter:\n%s\nholder:\n%s", n.mounterLog, h2.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.kill9Mounter()
	n.startMounter()
	buf := make([]byte, 64<<10)
	if _, err := f.ReadAt(buf, 1<<20); err != nil {
		t.Fatalf("a read after a holder restart and a mounter crash: %v", err)
	}
	if !bytes.Equal(buf, big[1<<20:1<<20+len(buf)]) {
		t.Error("wrong bytes after the holder restart and the crash")
	}

	// No mounter, then the holder stops: it waits, then detaches.
	n.kill9Mounter()
	stopped := time.Now()
	stopProcess(t, h2.cmd, 15*time.Second)
	t.Logf("MEASURE holder stopped with no mounter: exited after %v", time.Since(stopped).Round(time.Millisecond))
	took, err := timedRead(filepath.Join(a.target, "readme.txt"), 10*time.Second)
	t.Logf("MEASURE a read once the holder detached the mounts: %v after %v", err, took.Round(time.Microsecond))
	if !errors.Is(err, syscall.ENOTCONN) {
		t.Errorf("a read after the holder detached: %v, want ENOTCONN", err)
	}
	if ms := n.fuseMounts(); len(ms) != 0 {
		t.Errorf("FUSE mounts left after the holder detached: %v", ms)
	}
	if !h2.log.waitFor(10*time.Second, "no mounter: detached") {
		t.Errorf("the holder's log does not show the detach:\n%s", h2.log)
	}
}
