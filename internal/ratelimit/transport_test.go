package ratelimit

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// Both directions of a round trip through Transport take the limiter's
// time: an upload of 1 MiB and its 1 MiB echo at 1 MiB/s reserve 2s.
func TestTransportPacesBothBodies(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, r.Body)
	}))
	defer srv.Close()
	l, c := fake(1 << 20)
	client := &http.Client{Transport: Transport(http.DefaultTransport, l)}
	body := bytes.Repeat([]byte("x"), 1<<20)
	req, err := http.NewRequest(http.MethodPut, srv.URL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("echo: %d bytes, %v", len(got), err)
	}
	// Each direction's last read is paid by the next reservation: the
	// upload's by the download, the download's by nobody.
	if want := 2*time.Second - time.Second*maxRead/(1<<20); c.slept < want-time.Millisecond || c.slept > 2*time.Second {
		t.Fatalf("slept %v for 1 MiB up and 1 MiB down at 1 MiB/s, want about %v", c.slept, want)
	}
	t.Logf("slept %v", c.slept)
	if Transport(http.DefaultTransport, nil) != http.DefaultTransport {
		t.Fatal("a nil limiter wraps the transport")
	}
}
