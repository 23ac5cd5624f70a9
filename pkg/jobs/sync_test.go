package jobs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/internal/progress"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/source"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

func TestRunSyncSealsLogsAndRecordsTheVersion(t *testing.T) {
	ctx := context.Background()
	body := strings.Repeat("weights ", 20000)
	agents := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case agents <- r.UserAgent():
		default:
		}
		http.ServeContent(w, r, "w.bin", time.Unix(0, 0), strings.NewReader(body))
	}))
	t.Cleanup(srv.Close)
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dst := "oci:" + filepath.Join(t.TempDir(), "vol") + ":main"
	spec := Spec{Source: srv.URL + "/m/w.bin", Destination: dst, Tags: []string{"stable"}, AllowPrivateNetwork: true}
	if err := CheckSync(ctx, Spec{Source: spec.Source, Destination: dst + "@sha256:" + strings.Repeat("0", 64)}, "t/1"); err == nil {
		t.Error("CheckSync accepted a destination with a digest")
	}
	if err := CheckSync(ctx, spec, "t/1"); err != nil {
		t.Fatal(err)
	}
	j, err := s.Create(spec)
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	calls := 0
	out, err := s.RunSync(ctx, j.ID, SyncOptions{UserAgent: "t/1", Log: &log,
		Progress: func(c *progress.Counters) func() { calls++; return func() {} }})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 || out.Job != j.ID || out.Source != spec.Source || out.Files != 1 || out.Bytes != int64(len(body)) ||
		len(out.Tags) != 3 || !strings.Contains(out.Reference, "@sha256:") || out.Seconds <= 0 {
		t.Fatalf("report %+v (calls started %d times)", out, calls)
	}
	if ua := <-agents; ua != "t/1" {
		t.Errorf("source requests as %q", ua)
	}
	for _, want := range []string{"attempt 1: sync " + spec.Source, "listing ", "1 files, ", "to transfer", "sealed 1 files", out.Reference} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
	got, _ := s.Get(j.ID)
	if got.State != Succeeded || got.Reference != out.Reference || got.Progress.Files != 1 || got.Progress.Phase != "tagging" {
		t.Fatalf("job %+v", got)
	}
	ref, _ := oci.ParseRef(dst)
	tg, err := oci.Open(ctx, ref, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if root, err := versions.Resolve(ctx, tg, ref); err != nil || root.Desc.Digest.String() != out.Digest {
		t.Fatalf("main = %v, %v; want %s", root, err, out.Digest)
	}
}

// A job records what the user let its source reach: without
// --allow-private-network a source on loopback is refused, and the flag
// given at creation holds for the process that runs (or resumes) the job
// from its file.
func TestSyncJobKeepsNetworkPermissions(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "w.bin", time.Unix(0, 0), strings.NewReader("weights"))
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	dst := "oci:" + filepath.Join(t.TempDir(), "vol") + ":main"
	refused, err := s.Create(Spec{Source: srv.URL + "/w.bin", Destination: dst})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RunSync(ctx, refused.ID, SyncOptions{Log: io.Discard}); !errors.Is(err, source.ErrForbiddenAddress) ||
		!strings.Contains(err.Error(), "loopback") {
		t.Fatalf("sync of a loopback source without the flag: %v", err)
	}
	allowed, err := s.Create(Spec{Source: srv.URL + "/w.bin", Destination: dst, AllowPrivateNetwork: true, AllowLinkLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Open(dir) // as the detached or resumed process does
	if err != nil {
		t.Fatal(err)
	}
	j, err := again.Get(allowed.ID)
	if err != nil {
		t.Fatal(err)
	}
	if o := j.Spec.SourceOptions(""); !o.AllowPrivateNetwork || !o.AllowLinkLocal {
		t.Fatalf("the job file lost the permissions: %+v", j.Spec)
	}
	if _, err := again.RunSync(ctx, allowed.ID, SyncOptions{Log: io.Discard}); err != nil {
		t.Fatalf("sync with --allow-private-network: %v", err)
	}
}
