package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// TestMountKey: mounts are keyed by registry, repository and digest; the
// same digest in two repositories has two keys and two mountpoints, and a
// target record written before mount keys has its key from its pinned
// reference.
func TestMountKey(t *testing.T) {
	const d = "sha256:" + "ab" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd"
	a, _ := oci.ParseRef("reg.example/tenant-a/vol@" + d)
	b, _ := oci.ParseRef("evil.example/x@" + d)
	c, _ := oci.ParseRef("reg.example/tenant-b/vol@" + d)
	keys := map[string]bool{MountKey(a): true, MountKey(b): true, MountKey(c): true}
	names := map[string]bool{mountpointName(a): true, mountpointName(b): true, mountpointName(c): true}
	if len(keys) != 3 || len(names) != 3 {
		t.Fatalf("one digest in three repositories: keys %v, mountpoints %v; want three of each", keys, names)
	}
	if MountKey(a) != "reg.example/tenant-a/vol@"+d {
		t.Errorf("key %q", MountKey(a))
	}
	old := target{Path: "/p", Ref: "reg.example/tenant-a/vol:v1", Pinned: "reg.example/tenant-a/vol@" + d, Digest: d}
	if targetKey(old) != MountKey(a) {
		t.Errorf("old record: key %q, want %q", targetKey(old), MountKey(a))
	}
	if infoKey(MountInfo{Digest: d, Ref: old.Pinned}) != MountKey(a) {
		t.Error("a mount reported without a key (older mounter) gets none from its pinned reference")
	}
}

func TestKindOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("r/x:v1: %w", errdef.ErrNotFound), codes.NotFound},
		{fmt.Errorf("sha256:ab: %w", layout.ErrNotVolume), codes.InvalidArgument},
		{&errcode.ErrorResponse{StatusCode: 401}, codes.PermissionDenied},
		{&errcode.ErrorResponse{StatusCode: 403}, codes.PermissionDenied},
		{&errcode.ErrorResponse{StatusCode: 404}, codes.NotFound},
		{&errcode.ErrorResponse{StatusCode: 503}, codes.Unavailable},
		{fmt.Errorf("HEAD: %w", auth.ErrBasicCredentialNotFound), codes.PermissionDenied},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, codes.Unavailable},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), codes.Unavailable},
		{&mounterError{apiError{Kind: kindNotFound, Message: "m"}}, codes.NotFound},
		{&kindError{kindInvalid, errors.New("bad")}, codes.InvalidArgument},
		{fmt.Errorf("evil/x@sha256:ab: %w", oci.ErrMismatchedDigest), codes.PermissionDenied},
		{fmt.Errorf("evil/x:v1: %w", oci.ErrManifestTooLarge), codes.InvalidArgument},
		{errors.New("something else"), codes.Internal},
	} {
		if got := codeOf(kindOf(c.err)); got != c.want {
			t.Errorf("%v: code %v, want %v", c.err, got, c.want)
		}
	}
}

func TestTargetsRoundTrip(t *testing.T) {
	ts := targets{filepath.Join(t.TempDir(), "targets")}
	a := target{VolumeID: "v1", Path: "/pods/a/mount", Ref: "r/x:v1", Pinned: "r/x@sha256:aa", Digest: "sha256:aa", Bytes: 10, Files: 2}
	b := a
	b.Path, b.VolumeID = "/pods/b/mount", "v2"
	for _, x := range []target{a, b} {
		if err := ts.write(x); err != nil {
			t.Fatal(err)
		}
	}
	if got, ok := ts.read(a.Path); !ok || got != a {
		t.Fatalf("read = %+v, %v", got, ok)
	}
	if n := len(ts.all()); n != 2 {
		t.Fatalf("all: %d records, want 2", n)
	}
	ts.remove(a.Path)
	if _, ok := ts.read(a.Path); ok {
		t.Fatal("removed record still read")
	}
	if all := ts.all(); len(all) != 1 || all[0] != b {
		t.Fatalf("all after remove = %+v", all)
	}
}

// newTestNode is a node plugin whose mounter is not running.
func newTestNode(t *testing.T) *Node {
	t.Helper()
	n, err := NewNode(context.Background(), NodeOptions{NodeID: "n1", Version: "v0", StateDir: t.TempDir(),
		Mounter: NewMounterClient(filepath.Join(t.TempDir(), "none.sock")), Linger: time.Second,
		KubeletDir: os.TempDir()}) // where t.TempDir makes the targets
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestNodeRejectsBadRequests(t *testing.T) {
	n := newTestNode(t)
	ctx := context.Background()
	mount := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}
	tp := filepath.Join(t.TempDir(), "target")
	for name, req := range map[string]*csi.NodePublishVolumeRequest{
		"no volume id":  {TargetPath: tp, VolumeCapability: mount},
		"no target":     {VolumeId: "v", VolumeCapability: mount},
		"no capability": {VolumeId: "v", TargetPath: tp},
		"block":         {VolumeId: "v", TargetPath: tp, VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}},
		"malformed ref": {VolumeId: "v", TargetPath: tp, VolumeCapability: mount, VolumeContext: map[string]string{AttrRef: "Not A Ref"}},
		"layout ref":    {VolumeId: "v", TargetPath: tp, VolumeCapability: mount, VolumeContext: map[string]string{AttrRef: "oci:/etc:v1"}},
		"no tag":        {VolumeId: "v", TargetPath: tp, VolumeCapability: mount, VolumeContext: map[string]string{AttrRef: "r.example/x"}},
		"bad prefetch":  {VolumeId: "v", TargetPath: tp, VolumeCapability: mount, VolumeContext: map[string]string{AttrRef: "r.example/x:v1", AttrPrefetch: "[["}},
		"bad secret":    {VolumeId: "v", TargetPath: tp, VolumeCapability: mount, VolumeContext: map[string]string{AttrRef: "r.example/x:v1"}, Secrets: map[string]string{SecretDockerJSON: "{not json"}},
	} {
		_, err := n.NodePublishVolume(ctx, req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
		if name == "bad secret" && !strings.Contains(fmt.Sprint(err), SecretDockerJSON) {
			t.Errorf("%s: %v, want the secret named", name, err)
		}
	}
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	for name, tp := range map[string]string{"outside the kubelet dir": "/etc/target", "a file": file, "unclean": tp + "/../x"} {
		_, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "v", TargetPath: tp, VolumeCapability: mount,
			VolumeContext: map[string]string{AttrRef: "r.invalid/x:v1"}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(fmt.Sprint(err), "target") {
			t.Errorf("%s: %v, want InvalidArgument naming the target", name, err)
		}
	}
	if _, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{TargetPath: tp}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("unpublish without volume id: %v", err)
	}
	if _, err := n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "v", VolumePath: tp}); status.Code(err) != codes.NotFound {
		t.Errorf("stats of an unpublished path: %v, want NotFound", err)
	}
	info, err := n.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil || info.NodeId != "n1" {
		t.Errorf("NodeGetInfo = %v, %v", info, err)
	}
	pi, err := (&identity{version: "v0"}).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || pi.Name != DriverName || pi.VendorVersion != "v0" {
		t.Errorf("GetPluginInfo = %v, %v", pi, err)
	}
}

func TestNodeMounterDownIsUnavailable(t *testing.T) {
	n := newTestNode(t)
	_, err := n.opt.Mounter.Mount(context.Background(), mountRequest{Ref: "r.example/x@sha256:" + fmt.Sprintf("%064d", 0)})
	if codeOf(kindOf(err)) != codes.Unavailable {
		t.Fatalf("mounter not running: %v, want Unavailable", err)
	}
}

// TestNodeRefusesHugeArguments: a 1 MiB reference or volume id is refused
// with an error that does not echo it; so is a prefetch attribute of too
// many globs, before any registry is asked (the registry named here does
// not exist: asking it would fail otherwise).
func TestNodeRefusesHugeArguments(t *testing.T) {
	n := newTestNode(t)
	ctx := context.Background()
	mount := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}
	tp := filepath.Join(t.TempDir(), "target")
	huge := "r.example/x:" + strings.Repeat("a", 1<<20)
	var globs []string
	for i := range 120_000 {
		globs = append(globs, fmt.Sprintf("*.x%d", i))
	}
	for name, req := range map[string]*csi.NodePublishVolumeRequest{
		"huge ref":       {VolumeId: "v", TargetPath: tp, VolumeCapability: mount, VolumeContext: map[string]string{AttrRef: huge}},
		"huge volume id": {VolumeId: huge, TargetPath: tp, VolumeCapability: mount},
		"huge prefetch":  {VolumeId: "v", TargetPath: tp, VolumeCapability: mount, VolumeContext: map[string]string{AttrRef: "r.invalid/x:v1", AttrPrefetch: strings.Join(globs, ",")}},
		"257 globs":      {VolumeId: "v", TargetPath: tp, VolumeCapability: mount, VolumeContext: map[string]string{AttrRef: "r.invalid/x:v1", AttrPrefetch: strings.Join(globs[:257], ",")}},
	} {
		_, err := n.NodePublishVolume(ctx, req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, status.Code(err))
		}
		if msg := fmt.Sprint(err); len(msg) >= 4096 {
			t.Errorf("%s: error of %d bytes", name, len(msg))
		}
	}
	_, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: huge, TargetPath: tp})
	if status.Code(err) != codes.InvalidArgument || len(fmt.Sprint(err)) >= 4096 {
		t.Errorf("unpublish of a huge volume id: %v, error of %d bytes", status.Code(err), len(fmt.Sprint(err)))
	}
	_, err = n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: huge, VolumePath: tp})
	if status.Code(err) != codes.InvalidArgument || len(fmt.Sprint(err)) >= 4096 {
		t.Errorf("stats of a huge volume id: %v, error of %d bytes", status.Code(err), len(fmt.Sprint(err)))
	}
}

func TestCheckTargetPath(t *testing.T) {
	n := &Node{opt: NodeOptions{KubeletDir: "/var/lib/kubelet", MountsDir: "/var/lib/kubelet/plugins/csi.bdnvol.dev/mounts"}}
	for tp, ok := range map[string]bool{
		"/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/v/mount":    true,
		"/var/lib/kubelet/pods/u/../../../../etc/mount":                false,
		"/var/lib/kubelet/pods/u/./mount":                              false,
		"/var/lib/kubelet/pods/u/mount/":                               false,
		"pods/u/mount":                                                 false,
		"/var/lib/kubelet":                                             false,
		"/var/lib/kubeletx/pods/u/mount":                               false,
		"/etc/cron.d":                                                  false,
		"/var/lib/kubelet/plugins/csi.bdnvol.dev/mounts":               false,
		"/var/lib/kubelet/plugins/csi.bdnvol.dev/mounts/" + "ab12":     false,
		"/var/lib/kubelet/plugins/csi.bdnvol.dev/mountsx/pods/u/mount": true,
	} {
		err := n.checkTargetPath(tp)
		if ok && err != nil || !ok && status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v", tp, err)
		}
	}
}
