package e2e

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"google.golang.org/grpc"
)

// staticController stands in for what provisions a pre-provisioned
// PersistentVolume: CreateVolume hands back a volume whose handle is the
// reference, which is all a bdnvol volume needs (the plugin has no
// controller). csi-sanity's node tests create their volumes through it.
type staticController struct {
	csi.UnimplementedControllerServer
}

// staticIdentity is the stand-in's Identity service (sanity checks every
// endpoint's).
type staticIdentity struct {
	csi.UnimplementedIdentityServer
}

func (staticIdentity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "static.csi.bdnvol.dev", VendorVersion: "e2e"}, nil
}

func (staticIdentity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

func (staticIdentity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (staticController) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	ref := req.GetParameters()["ref"]
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: ref, VolumeContext: req.GetParameters()}}, nil
}

func (staticController) DeleteVolume(context.Context, *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	return &csi.DeleteVolumeResponse{}, nil
}

func (staticController) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}},
	}}}, nil
}

// TestCSISanity runs the community's conformance suite (csi-test's
// sanity) against the real node plugin and mounter with a real registry.
// The plugin advertises no controller, so sanity skips the controller
// suite and the node tests that need controller publishing or staging.
func TestCSISanity(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, richTree(), time.Time{})
	repo := reg.Host + "/vols/sanity"
	push(t, repo, repo+":v1", src, smallChunks...)
	n := startCSI(t, 200*time.Millisecond)

	ctrl := filepath.Join(n.root, "controller.sock")
	l, err := net.Listen("unix", ctrl)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	csi.RegisterControllerServer(gs, staticController{})
	csi.RegisterIdentityServer(gs, staticIdentity{})
	go gs.Serve(l)
	t.Cleanup(gs.Stop)

	work := filepath.Join(n.root, "sanity")
	cfg := sanity.NewTestConfig()
	cfg.Address = "unix://" + n.endpoint
	cfg.ControllerAddress = "unix://" + ctrl
	cfg.TargetPath = filepath.Join(work, "target")
	cfg.StagingPath = filepath.Join(work, "staging")
	cfg.TestVolumeParameters = map[string]string{"ref": repo + ":v1", "prefetch": "none"}
	cfg.IdempotentCount = 2
	cfg.CreateTargetDir = func(p string) (string, error) { return p, os.MkdirAll(p, 0o755) }
	cfg.CreateStagingDir = cfg.CreateTargetDir
	cfg.CheckPath = func(p string) (sanity.PathKind, error) {
		fi, err := os.Stat(p)
		switch {
		case os.IsNotExist(err):
			return sanity.PathIsNotFound, nil
		case err != nil:
			return sanity.PathIsOther, err
		case fi.IsDir():
			return sanity.PathIsDir, nil
		}
		return sanity.PathIsFile, nil
	}
	// The controller suites test a controller, which bdnvol does not have
	// (the stand-in above only hands sanity's node tests their volumes).
	sc := sanity.GinkgoTest(&cfg)
	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	suite.SkipStrings = []string{`\[Controller Server\]`, `\[GroupController `}
	reporter.NoColor = true
	if !ginkgo.RunSpecs(t, "bdnvol CSI sanity", suite, reporter) {
		t.Error("csi-sanity failed")
	}
	sc.Finalize()
	if ms := n.fuseMounts(); len(ms) > 1 {
		t.Errorf("sanity left %d FUSE mounts: %v", len(ms), ms)
	}
}
