package e2e

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// gateProxy is a reverse proxy in front of a registry that holds every
// blob request while it is shut (the node plugin checks a reference with
// manifest requests; the mounter's open reads blobs), and counts the
// requests it holds.
type gateProxy struct {
	Host    string
	mu      sync.Mutex
	open    chan struct{} // closed while the gate is open
	holding atomic.Int32
	down    atomic.Bool // answer 503 to every request
	refused atomic.Int32
}

// newGateProxy starts an open gate in front of reg.
func newGateProxy(t *testing.T, reg *registry) *gateProxy {
	t.Helper()
	u, err := url.Parse(reg.URL)
	if err != nil {
		t.Fatal(err)
	}
	g := &gateProxy{open: make(chan struct{})}
	close(g.open)
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.down.Load() {
			g.refused.Add(1)
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		g.mu.Lock()
		open := g.open
		g.mu.Unlock()
		select {
		case <-open:
		default:
			if !strings.Contains(r.URL.Path, "/blobs/") {
				break
			}
			g.holding.Add(1)
			<-open
			g.holding.Add(-1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { g.release(); srv.Close() })
	g.Host = strings.TrimPrefix(srv.URL, "http://")
	return g
}

// shut makes the gate hold every request from now on.
func (g *gateProxy) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		g.open = make(chan struct{})
	default:
	}
}

// release lets every request held, and every later one, through.
func (g *gateProxy) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// TestCSIMounterHandoffMountInProgress: a mount request still opening its
// version (the registry slow) when a successor asks for the mounts is
// waited for and handed over with the others: the publish succeeds, the old
// mounter's SIGTERM leaves the mount alone, and the successor serves it
// with the right bytes.
func TestCSIMounterHandoffMountInProgress(t *testing.T) {
	reg := newDistribution(t)
	gate := newGateProxy(t, reg)
	src := filepath.Join(t.TempDir(), "model")
	if err := synth.Generate(src, synth.Options{TargetBytes: 8 << 20, Shards: 2, Seed: 36}); err != nil {
		t.Fatal(err)
	}
	d := push(t, reg.Host+"/vols/inprogress", reg.Host+"/vols/inprogress:v1", src)
	n := startCSI(t, time.Minute)
	// One mount served already, handed over as before.
	a := n.newPod("a")
	n.mustPublish(a, gate.Host+"/vols/inprogress@"+d, "")
	// The second, another version (none of its blobs cached), is in
	// progress when the handoff starts.
	src2 := filepath.Join(t.TempDir(), "model2")
	if err := synth.Generate(src2, synth.Options{TargetBytes: 8 << 20, Shards: 2, Seed: 37}); err != nil {
		t.Fatal(err)
	}
	d2 := push(t, reg.Host+"/vols/inprogress2", reg.Host+"/vols/inprogress2:v1", src2)
	gate.shut()
	b := n.newPod("b")
	published := make(chan error, 1)
	go func() { published <- n.publish(b, gate.Host+"/vols/inprogress2@"+d2, "") }()
	for deadline := time.Now().Add(30 * time.Second); gate.holding.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the mount request never reached the registry")
		}
	}
	// The registry answers 1.5s into the handoff.
	go func() { time.Sleep(1500 * time.Millisecond); gate.release() }()
	start := time.Now()
	old := n.startSuccessor(bin(t))
	took := time.Since(start)
	select {
	case err := <-published:
		if err != nil {
			t.Fatalf("the publish in progress across the handoff: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the publish in progress across the handoff did not return")
	}
	stopProcess(t, old, 30*time.Second)
	t.Logf("MEASURE handoff with a mount in progress (registry answering 1.5s in): successor serving after %v", took.Round(time.Millisecond))
	if ms := n.fuseMounts(); len(ms) != 2 {
		t.Errorf("FUSE mounts after the handoff and the old mounter's stop: %v, want both", ms)
	}
	if !n.mounterLog.waitFor(10*time.Second, `"msg":"took over from the predecessor","component":"mounter","mounts":2,`) {
		t.Errorf("the successor did not take both mounts over:\n%s", n.mounterLog)
	}
	compareTrees(t, src, a.target)
	compareTrees(t, src2, b.target)
}

// TestCSIMounterResumeRetries: the mounter is killed (the fd holder keeps
// its mount) and its successor starts while the registry is down and the
// cache is empty, so that it cannot open the version: it keeps the mount
// and retries; a read meanwhile waits in the kernel's queue, and gets the
// right bytes once the registry is back.
func TestCSIMounterResumeRetries(t *testing.T) {
	reg := newDistribution(t)
	gate := newGateProxy(t, reg)
	src := filepath.Join(t.TempDir(), "model")
	if err := synth.Generate(src, synth.Options{TargetBytes: 8 << 20, Shards: 2, Seed: 38}); err != nil {
		t.Fatal(err)
	}
	d := push(t, reg.Host+"/vols/retry", reg.Host+"/vols/retry:v1", src)
	n := startCSIWith(t, time.Minute, "1GiB", nil)
	h := n.startHolder()
	n.mounterFlags = []string{"--fd-holder", h.socket}
	stopProcess(t, n.mounter, 30*time.Second)
	n.startMounter()
	a := n.newPod("a")
	n.mustPublish(a, gate.Host+"/vols/retry@"+d, "")
	f, err := os.Open(filepath.Join(a.target, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n.kill9Mounter()
	gate.down.Store(true)
	ents, _ := os.ReadDir(n.cacheDir)
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(n.cacheDir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	read := make(chan error, 1)
	var got []byte
	go func() {
		var err error
		got, err = io.ReadAll(f)
		read <- err
	}()
	start := time.Now()
	n.startSuccessor(bin(t), "--fd-holder", h.socket)
	time.Sleep(2 * time.Second)
	select {
	case err := <-read:
		t.Fatalf("a read while the successor cannot open the version returned %v; want it to wait", err)
	default:
	}
	if ms := n.fuseMounts(); len(ms) != 1 {
		t.Errorf("FUSE mounts while the successor retries: %v, want the one kept", ms)
	}
	refused := gate.refused.Load()
	if refused == 0 {
		t.Errorf("the successor never asked the registry while it was down:\n%s", n.mounterLog)
	}
	gate.down.Store(false)
	up := time.Now()
	select {
	case err := <-read:
		if err != nil {
			t.Fatalf("the read queued while the successor retried: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the read queued while the successor retried did not return a minute after the registry came back:\n%s", n.mounterLog)
	}
	want, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("the read queued while the successor retried returned wrong bytes")
	}
	t.Logf("MEASURE successor retrying a mount it cannot open: %d requests refused while down; the queued read returned %v after the registry came back, %v after the successor started",
		refused, time.Since(up).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	// The mounter logs "served after retrying" once it serves, so the read can
	// return before the line reaches the test through the output pipe.
	if !n.mounterLog.waitFor(10*time.Second, "cannot be served yet: retrying", "served after retrying") {
		t.Errorf("the successor's log does not show it retried:\n%s", n.mounterLog.String())
	}
	compareTrees(t, src, a.target)
}
