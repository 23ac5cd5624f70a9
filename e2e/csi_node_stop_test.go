package e2e

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCSINodeStopCancelsPublish: SIGTERM to the node plugin while a
// publish waits on a registry that accepts the connection and never
// answers ends the plugin well within kubelet's 30 s grace, and the
// publish fails (Unavailable, to be retried); the plugin used to wait out
// the publish's own 30 s registry timeout first, and kubelet killed it.
func TestCSINodeStopCancelsPublish(t *testing.T) {
	asked := make(chan struct{}, 1)
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case asked <- struct{}{}:
		default:
		}
		<-release // never answers while the test runs
	}))
	t.Cleanup(hung.Close)
	t.Cleanup(func() { close(release) }) // runs first: the handlers return, then the server closes
	host := strings.TrimPrefix(hung.URL, "http://")

	n := startCSI(t, time.Minute)
	p := n.newPod("hung")
	published := make(chan error, 1)
	go func() { published <- n.publish(p, host+"/vols/never:prod", "") }()
	select {
	case <-asked:
	case err := <-published:
		t.Fatalf("the publish returned before reaching the registry: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the publish never reached the registry")
	}

	node := n.node
	if err := node.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- node.Wait() }()
	// kubelet's grace is 30 s; a third of it is plenty for a plugin that
	// cancels its publishes, and far less than the 30 s a publish waits
	// for a registry.
	const limit = 10 * time.Second
	select {
	case err := <-exited:
		t.Logf("the node plugin exited after SIGTERM: %v", err)
	case <-time.After(limit):
		node.Process.Kill()
		<-exited
		t.Errorf("the node plugin did not exit within %v of SIGTERM while a publish waited on a registry", limit)
	}
	n.node = nil
	select {
	case err := <-published:
		if err == nil {
			t.Fatal("the publish cut short by the stop succeeded")
		}
		if c := status.Code(err); c != codes.Unavailable {
			t.Errorf("the publish cut short by the stop: %v (code %v), want Unavailable", err, c)
		}
		t.Logf("the publish: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the publish did not return after the node plugin exited")
	}
}
