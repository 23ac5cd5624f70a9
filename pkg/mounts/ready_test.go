package mounts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/profile"
)

// helperEnv makes the test binary act as a mount daemon (see TestMain).
const helperEnv = "BDNVOL_MOUNTS_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "ready":
		notify, closeFn := Notifier()
		defer closeFn()
		if os.Getenv(ReadyFDEnv) != "" {
			fmt.Fprintln(os.Stderr, "bdnvol: the ready descriptor leaked into the environment")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "bdnvol: serving")
		notify([]string{"r.example/a@sha256:01", "r.example/b@sha256:02"})
		time.Sleep(100 * time.Millisecond)
		os.Exit(0)
	case "fail":
		fmt.Fprintln(os.Stderr, "bdnvol: starting")
		fmt.Fprintln(os.Stderr, "bdnvol: r.example/a:v1: not found")
		os.Exit(1)
	case "silent":
		os.Exit(1)
	case "handoff":
		// Report the root handed off for each of two targets, "none"
		// for one without.
		notify, closeFn := Notifier()
		defer closeFn()
		wait, _ := time.ParseDuration(os.Getenv(helperEnv + "_WAIT"))
		got := Handoff(context.Background(), handoffTargets(), wait)
		var roots []string
		for _, t := range got {
			if t.Root.Digest == "" {
				roots = append(roots, "none")
			} else {
				roots = append(roots, t.Root.Digest.String())
			}
		}
		notify(roots)
		os.Exit(0)
	case "handoff-profile":
		// Report, for each target, the profile lookup handed off after
		// the roots: "VERSION:CHUNKS", "VERSION:err:MESSAGE", or "none".
		notify, closeFn := Notifier()
		defer closeFn()
		got := Handoff(context.Background(), handoffTargets(), 30*time.Second)
		var out []string
		for _, t := range got {
			l, ok := profile.Lookup{}, false
			if t.Profile != nil {
				l, ok = t.Profile(context.Background())
			}
			switch {
			case !ok:
				out = append(out, "none")
			case l.Err != "":
				out = append(out, l.Version.String()+":err:"+strings.ReplaceAll(l.Err, " ", "_"))
			default:
				p, err := profile.Parse(l.Doc)
				if err != nil {
					out = append(out, "unparsed")
					continue
				}
				out = append(out, fmt.Sprintf("%s:%d", l.Version, len(p.Chunks)))
			}
		}
		notify(out)
		os.Exit(0)
	}
}

// handoffTargets are the targets the "handoff" helper mounts.
func handoffTargets() []Target {
	a, _ := oci.ParseRef("r.example/a:v1")
	b, _ := oci.ParseRef("r.example/b:v1")
	return []Target{{Ref: a, Mountpoint: "/m/a"}, {Ref: b, Mountpoint: "/m/b"}}
}

// TestHandoff: a daemon started with a handoff gets the roots its starting
// process resolved, each for its own reference and mountpoint; a root the
// starter had not resolved by the daemon's deadline is not waited for
// further (the daemon resolves it itself).
func TestHandoff(t *testing.T) {
	root := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("a"), Size: 1}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(helperEnv, "handoff")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Setenv(helperEnv+"_WAIT", "30s")
	d, err := Daemonize(ctx, exe, nil, filepath.Join(t.TempDir(), "d.log"), func() []Target {
		ts := handoffTargets()
		ts[0].Root = root
		ts[1].Mountpoint = "/elsewhere" // not the daemon's target
		ts[1].Root = root
		return ts
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{root.Digest.String(), "none"}; !reflect.DeepEqual(d.Pinned, want) {
		t.Errorf("the daemon got %q; want %q", d.Pinned, want)
	}

	t.Setenv(helperEnv+"_WAIT", "100ms")
	release := make(chan struct{})
	defer close(release)
	d, err = Daemonize(ctx, exe, nil, filepath.Join(t.TempDir(), "d.log"), func() []Target {
		<-release
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"none", "none"}; !reflect.DeepEqual(d.Pinned, want) {
		t.Errorf("the daemon got %q from a handoff that never came; want %q", d.Pinned, want)
	}
}

// TestHandoffProfile: the profile lookups the starting process hands off
// after the roots reach the daemon, each for its own reference and
// mountpoint, the document and a failure alike, though they come after
// the roots (the daemon's Open does not wait for them) and a lookup is
// still going on when the daemon is ready.
func TestHandoffProfile(t *testing.T) {
	root := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("a"), Size: 1}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(helperEnv, "handoff-profile")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	doc := profile.New(root.Digest, []digest.Digest{digest.FromString("c1"), digest.FromString("c2")}).Encode()
	slow := make(chan struct{})
	d, err := Daemonize(ctx, exe, nil, filepath.Join(t.TempDir(), "d.log"), func() []Target {
		ts := handoffTargets()
		ts[0].Root = root
		ts[0].Profile = func(context.Context) (profile.Lookup, bool) {
			<-slow // handed off after the roots
			return profile.Lookup{Version: root.Digest, Doc: doc}, true
		}
		ts[1].Root = root
		ts[1].Profile = func(context.Context) (profile.Lookup, bool) {
			return profile.Lookup{Version: root.Digest, Err: "registry says no"}, true
		}
		time.AfterFunc(200*time.Millisecond, func() { close(slow) })
		return ts
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{root.Digest.String() + ":2", root.Digest.String() + ":err:registry_says_no"}; !reflect.DeepEqual(d.Pinned, want) {
		t.Errorf("the daemon got %q; want %q", d.Pinned, want)
	}
}

func TestReadyLine(t *testing.T) {
	var b bytes.Buffer
	writeReady(&b, []string{"x@sha256:1", "y@sha256:2"})
	got, ok := readReady(&b)
	if !ok || !reflect.DeepEqual(got, []string{"x@sha256:1", "y@sha256:2"}) {
		t.Fatalf("readReady = %q, %v", got, ok)
	}
	for _, in := range []string{"", "error: no\n", "ready"} {
		if got, ok := readReady(strings.NewReader(in)); ok && in != "ready" {
			t.Errorf("readReady(%q) = %q, true; want false", in, got)
		}
	}
}

func daemonize(t *testing.T, mode string) (Daemon, error) {
	t.Helper()
	t.Setenv(helperEnv, mode)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return Daemonize(ctx, exe, nil, filepath.Join(t.TempDir(), "logs", "d.log"), nil)
}

func TestDaemonizeReady(t *testing.T) {
	d, err := daemonize(t, "ready")
	if err != nil {
		t.Fatal(err)
	}
	if d.PID <= 0 || !reflect.DeepEqual(d.Pinned, []string{"r.example/a@sha256:01", "r.example/b@sha256:02"}) {
		t.Fatalf("Daemon = %+v", d)
	}
	time.Sleep(300 * time.Millisecond)
	b, err := os.ReadFile(d.Log)
	if err != nil || !strings.Contains(string(b), "bdnvol: serving") || strings.Contains(string(b), "leaked") {
		t.Fatalf("daemon log: %q, %v", b, err)
	}
}

func TestDaemonizeFailure(t *testing.T) {
	_, err := daemonize(t, "fail")
	if err == nil || err.Error() != "r.example/a:v1: not found" {
		t.Fatalf("Daemonize error = %v; want the last line of the daemon's log", err)
	}
	_, err = daemonize(t, "silent")
	if !errors.Is(err, ErrNotReady) {
		t.Fatalf("Daemonize error = %v; want ErrNotReady", err)
	}
}
