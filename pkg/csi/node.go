package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"oras.land/oras-go/v2/registry/remote/credentials"

	"github.com/bdnvol/bdnvol/pkg/mounts"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// Volume attributes and secrets the plugin reads.
const (
	AttrRef      = "ref"
	AttrPrefetch = "prefetch"
	// AttrRequireSignature names a cosign public key, inline PEM or a file
	// under NodeOptions.KeyDir; the version must carry a valid signature by it.
	AttrRequireSignature = "requireSignature"
	SecretDockerJSON     = ".dockerconfigjson"
	attrPodNamespace     = "csi.storage.k8s.io/pod.namespace"
	attrPodName          = "csi.storage.k8s.io/pod.name"
)

// NodeOptions configure a Node.
type NodeOptions struct {
	NodeID   string
	Version  string         // reported by GetPluginInfo
	StateDir string         // target records (refcounts)
	KeyDir   string         // where requireSignature may name key files ("": inline keys only)
	Mounter  *MounterClient // the mounter holding the FUSE mounts
	OCI      oci.Options    // for resolving references and the access check
	Linger   time.Duration  // how long an unused version stays mounted
	Logger   *slog.Logger
	// KubeletDir is the directory target paths must lie beneath (""
	// for DefaultKubeletDir); MountsDir is the mounter's, refused as a
	// target.
	KubeletDir string
	MountsDir  string
	// WarmstateFields are this node's warm-state key fields (GPU model,
	// compute capability, driver): a warmstateKey lacking them gets them,
	// one naming other values is refused.
	WarmstateFields map[string]string
	// WarmstatePublish lets a volume's warmstatePublish publish what its
	// pod wrote, with the node's credentials: only where the pods are
	// trusted to write caches that others run (or readers require
	// signatures). Off, such a volume is refused.
	WarmstatePublish bool
	// WarmstateLowerTTL is how long a companion's lower directory stays on
	// the node after the last pod using it is gone (0: DefaultWarmstateLowerTTL).
	WarmstateLowerTTL time.Duration
	// WarmstateMaxBytes bounds what a pod's upper layer may hold to be
	// published (0: DefaultWarmstateMaxBytes).
	WarmstateMaxBytes int64
	// WarmList is a warm list file whose `REF warmstate:KEY` lines name
	// companions the node pulls ahead of pods ("" for none), read every
	// WarmListInterval (0: DefaultWarmListInterval).
	WarmList         string
	WarmListInterval time.Duration
}

// Node is the CSI node plugin: the Identity and Node services.
type Node struct {
	csi.UnimplementedNodeServer
	opt NodeOptions
	log *slog.Logger
	ts  targets

	// Mounts are keyed by REGISTRY/REPOSITORY@DIGEST (see MountKey), never
	// by digest alone.
	mu         sync.Mutex               // guards the maps and the records' refcounts; never held across a mounter call
	lingers    map[string]*time.Timer   // mount keys waiting to be unmounted
	unmounting map[string]chan struct{} // mount keys the mounter is unmounting, closed when done
	pending    map[string]int           // publishes in progress, by mount key
	busy       map[string]bool          // target paths being worked on

	listedMu sync.Mutex
	listed   map[string]string // warm list companions: "REF\x00KEY" -> companion hex kept on the node
}

// mounterCallTimeout bounds every call to the mounter: one that does not
// answer fails that call, and holds up nothing else.
var mounterCallTimeout = 2 * time.Minute

// targetKey is the mount key of a target record, from its pinned
// reference (records older than mount keys have it too).
func targetKey(t target) string {
	if k := keyOfPinned(t.Pinned); k != "" {
		return k
	}
	return t.Digest
}

// infoKey is the mount key of a mount the mounter reports (an older
// mounter sends no key: it comes from the pinned reference).
func infoKey(i MountInfo) string {
	if i.Key != "" {
		return i.Key
	}
	return keyOfPinned(i.Ref)
}

// NewNode returns the node plugin, re-attached to what an earlier one left:
// records whose target is no longer mounted are dropped, and versions the
// mounter serves for no target start their linger. A target whose mount is
// dead is left to kubelet's next publish or unpublish of it (see
// clearDead): a pod may still have it, and an error is the truth for it.
func NewNode(ctx context.Context, opt NodeOptions) (*Node, error) {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.NodeID == "" {
		return nil, errors.New("csi node: no node id")
	}
	if opt.KubeletDir == "" {
		opt.KubeletDir = DefaultKubeletDir
	}
	opt.KubeletDir, opt.MountsDir = cleanDir(opt.KubeletDir), cleanDir(opt.MountsDir)
	n := &Node{opt: opt, log: opt.Logger, ts: targets{filepath.Join(opt.StateDir, "targets")}, lingers: map[string]*time.Timer{},
		unmounting: map[string]chan struct{}{}, pending: map[string]int{}, busy: map[string]bool{}}
	refs := map[string]int{}
	for _, t := range n.ts.all() {
		if m, ok := mounts.At(t.Path); !ok || m.Digest != t.Digest {
			n.ts.remove(t.Path)
			n.log.Info("dropped a target no longer mounted", "target", t.Path, "digest", t.Digest)
			continue
		}
		if mounts.NotConnected(t.Path) {
			n.log.Warn("target holds a dead mount (its mounter is gone): replaced at its next publish, removed at its unpublish", "target", t.Path, "digest", t.Digest)
		}
		refs[targetKey(t)]++
	}
	lctx, cancel := context.WithTimeout(ctx, mounterCallTimeout)
	served, err := opt.Mounter.List(lctx)
	cancel()
	if err != nil {
		n.log.Warn("mounter not reachable at start", "error", err.Error())
	}
	n.mu.Lock() // a short linger may fire before the loop ends
	for _, m := range served {
		if k := infoKey(m); refs[k] == 0 {
			n.lingerLocked(k)
		}
	}
	n.mu.Unlock()
	n.log.Info("re-attached", "targets", len(n.ts.all()), "mounts", len(refs), "mounter_mounts", len(served))
	n.sweepWarmLowers()
	return n, nil
}

// Serve serves the Identity and Node services on l until ctx ends. Then
// the calls in progress are cancelled (a publish waiting on a registry
// fails with Unavailable, for kubelet to retry) and Serve returns once
// they have.
func (n *Node) Serve(ctx context.Context, l net.Listener) error {
	s := grpc.NewServer(grpc.UnaryInterceptor(cancelOnStop(ctx)))
	csi.RegisterIdentityServer(s, &identity{version: n.opt.Version})
	csi.RegisterNodeServer(s, n)
	go func() { <-ctx.Done(); s.GracefulStop() }()
	return s.Serve(l)
}

// cancelOnStop is an interceptor that cancels each call's context when
// stop ends, so that a stop waits for no registry; a call that fails then
// fails with Unavailable.
func cancelOnStop(stop context.Context) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(stop, cancel)()
		resp, err := handler(ctx, req)
		if err != nil && stop.Err() != nil {
			err = status.Errorf(codes.Unavailable, "the node plugin is stopping: %s", status.Convert(err).Message())
		}
		return resp, err
	}
}

// refcount is how many targets use mount key d, or are being published
// with it. Call with n.mu held.
func (n *Node) refcount(d string) int {
	c := n.pending[d]
	for _, t := range n.ts.all() {
		if targetKey(t) == d {
			c++
		}
	}
	return c
}

// lingerLocked unmounts the version of mount key d after the linger unless
// a publish takes it again. Call with n.mu held.
func (n *Node) lingerLocked(d string) {
	if t, ok := n.lingers[d]; ok {
		t.Stop()
	}
	n.lingers[d] = time.AfterFunc(n.opt.Linger, func() {
		n.mu.Lock()
		delete(n.lingers, d)
		if n.refcount(d) > 0 || n.unmounting[d] != nil {
			n.mu.Unlock()
			return
		}
		if err := n.unmountUnlocking(d); err != nil {
			n.log.Warn("unmount after linger failed", "key", d, "error", err.Error())
			return
		}
		n.log.Info("unmounted after linger", "key", d)
	})
}

// unmountUnlocking unmounts mount key k, marked as being unmounted
// meanwhile (startUnmountLocked). Call with n.mu held; it returns with n.mu
// released, and the mounter's error.
func (n *Node) unmountUnlocking(k string) error {
	done := n.startUnmountLocked(k)
	n.mu.Unlock()
	defer done()
	return n.unmount(k)
}

// startUnmountLocked marks mount key k as being unmounted until the
// returned function is called: a publish of k meanwhile waits for it. Call
// with n.mu held, and call the mounter after releasing it.
func (n *Node) startUnmountLocked(k string) (done func()) {
	ch := make(chan struct{})
	n.unmounting[k] = ch
	return func() {
		n.mu.Lock()
		delete(n.unmounting, k)
		n.mu.Unlock()
		close(ch)
	}
}

// unmount asks the mounter to unmount the mount of key k, each call within
// mounterCallTimeout. A mounter older than mount keys (it reports none)
// holds one mount per digest, which pods of another repository may use: it
// is left to the last key of the digest. Call without n.mu.
func (n *Node) unmount(k string) error {
	if _, d, ok := strings.Cut(k, "@"); ok {
		lctx, cancel := context.WithTimeout(context.Background(), mounterCallTimeout)
		ms, err := n.opt.Mounter.List(lctx)
		cancel()
		if err == nil {
			for _, m := range ms {
				if m.Key != "" || m.Digest != d {
					continue
				}
				n.mu.Lock()
				used := n.digestRefsLocked(d) > 0
				n.mu.Unlock()
				if used {
					return nil
				}
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), mounterCallTimeout)
	defer cancel()
	return n.opt.Mounter.Unmount(ctx, k)
}

// digestRefsLocked is how many targets use digest d, or are being
// published with it, in any repository. Call with n.mu held.
func (n *Node) digestRefsLocked(d string) int {
	c := 0
	for k, p := range n.pending {
		if strings.HasSuffix(k, "@"+d) {
			c += p
		}
	}
	for _, t := range n.ts.all() {
		if t.Digest == d {
			c++
		}
	}
	return c
}

func (n *Node) keepLocked(d string) {
	if t, ok := n.lingers[d]; ok {
		t.Stop()
		delete(n.lingers, d)
	}
}

// NodePublishVolume resolves the reference with the pod's credentials,
// checks they can read it, and binds the digest's mount read-only at the
// target path.
func (n *Node) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if err := checkRequest(req.GetVolumeId(), "target path", req.GetTargetPath(), AttrRef, req.GetVolumeContext()[AttrRef]); err != nil {
		return nil, err
	}
	tp := req.GetTargetPath()
	vc := req.GetVolumeCapability()
	if vc == nil {
		return nil, status.Error(codes.InvalidArgument, "volume capability missing")
	}
	if vc.GetBlock() != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: block access is not supported; bdnvol volumes are file systems", req.GetVolumeId())
	}
	s := req.GetVolumeContext()[AttrRef]
	if s == "" {
		s = req.GetVolumeId() // a pre-provisioned volume: the handle is the reference
	}
	ref, err := oci.ParseRef(s)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: ref %q: %v", req.GetVolumeId(), s, err)
	}
	if ref.Layout != "" || ref.Reference() == "" {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: ref %q: name a registry repository with a tag or a digest", req.GetVolumeId(), s)
	}
	prefetch := req.GetVolumeContext()[AttrPrefetch]
	if _, err := mounts.Prefetcher(prefetch); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: %s: %v", req.GetVolumeId(), AttrPrefetch, err)
	}
	policy, err := signature.PolicyFromValue(req.GetVolumeContext()[AttrRequireSignature], n.opt.KeyDir)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: %s: %v", req.GetVolumeId(), AttrRequireSignature, err)
	}
	if err := n.checkTargetPath(tp); err != nil {
		return nil, err
	}
	if _, warm := req.GetVolumeContext()[AttrWarmstateKey]; warm {
		return n.publishWarm(ctx, req, ref, policy)
	}
	start := time.Now()
	done, err := n.claim(tp)
	if err != nil {
		return nil, err
	}
	defer done()
	if t, ok := n.ts.read(tp); ok {
		if m, mounted := mounts.At(tp); mounted && m.Digest == t.Digest && !mounts.NotConnected(tp) {
			if t.VolumeID != req.GetVolumeId() {
				return nil, status.Errorf(codes.AlreadyExists, "%s: already publishes volume %s", tp, t.VolumeID)
			}
			return &csi.NodePublishVolumeResponse{}, nil
		}
		n.mu.Lock()
		n.ts.remove(tp)
		n.releaseLocked(targetKey(t))
		n.mu.Unlock()
	}
	if err := n.clearDead(tp); err != nil {
		return nil, err
	}
	if err := n.checkTarget(tp); err != nil {
		return nil, err
	}

	// Resolve the reference and check access with the pod's own
	// credentials, every time, also when the version is mounted already:
	// the manifest's bytes are read (a GET) from the registry and
	// repository the pod names and must hash to the digest; a digest the
	// registry merely claims is not trusted.
	creds, cred, err := n.podCredentials(ctx, ref, req.GetSecrets())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: %s: %v", req.GetVolumeId(), SecretDockerJSON, err)
	}
	opt := n.opt.OCI
	opt.Credentials = creds
	opt.Retry = oci.RetryPolicy{MaxAttempts: 3, Base: 100 * time.Millisecond, MaxWait: time.Second}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	repo, err := oci.Open(rctx, ref, opt)
	if err != nil {
		return nil, status.Errorf(codeOf(kindOf(err)), "volume %s: %s: %v", req.GetVolumeId(), ref, err)
	}
	desc, err := signature.Resolve(rctx, repo, ref, policy)
	if errors.Is(err, signature.ErrRefused) {
		return nil, status.Errorf(codes.PermissionDenied, "volume %s: %v", req.GetVolumeId(), err)
	}
	if err != nil {
		return nil, status.Errorf(codeOf(kindOf(err)), "volume %s: %v", req.GetVolumeId(), err)
	}
	pinned := ref.Pinned(desc.Digest)
	d := keyOfPinned(pinned)

	// From here the version is held: no linger unmounts it under us.
	n.mu.Lock()
	n.keepLocked(d)
	n.pending[d]++
	wait := n.unmounting[d]
	n.mu.Unlock()
	var t target
	var info MountInfo
	if wait != nil { // an unmount after the linger is under way: mount anew after it
		select {
		case <-wait:
		case <-ctx.Done():
			err = status.Errorf(codes.Unavailable, "volume %s: %s: waiting for its unmount: %v", req.GetVolumeId(), s, ctx.Err())
		}
	}
	if err == nil {
		t, info, err = n.bind(ctx, req, s, pinned, mountRequest{Ref: pinned, Prefetch: prefetch, Auth: cred, IndexKeys: indexKeys(policy)})
	}
	n.mu.Lock()
	n.pending[d]--
	if n.pending[d] == 0 {
		delete(n.pending, d)
	}
	if err != nil {
		if info.Digest != "" {
			n.abandon(info) // unlocks
		} else {
			n.releaseLocked(d)
			n.mu.Unlock()
		}
		return nil, err
	}
	n.mu.Unlock()
	n.log.Info("published", "volume_id", t.VolumeID, "ref", s, "digest", info.Digest, "target", tp, "pod", t.Pod,
		"new_mount", info.New, "ms", time.Since(start).Milliseconds())
	return &csi.NodePublishVolumeResponse{}, nil
}

// bind asks the mounter for pinned's mount, records the target and binds
// the mount read-only there (the record comes first: unpublish acts only on
// recorded targets). On failure it leaves no bind and no record; info
// names the mounter's mount when there is one.
func (n *Node) bind(ctx context.Context, req *csi.NodePublishVolumeRequest, ref, pinned string, mreq mountRequest) (target, MountInfo, error) {
	tp := req.GetTargetPath()
	mctx, cancel := context.WithTimeout(ctx, mounterCallTimeout)
	info, err := n.opt.Mounter.Mount(mctx, mreq)
	cancel()
	if err != nil {
		return target{}, MountInfo{}, status.Errorf(codeOf(kindOf(err)), "volume %s: %s: %v", req.GetVolumeId(), ref, err)
	}
	t := target{VolumeID: req.GetVolumeId(), Path: tp, Ref: ref, Pinned: pinned, Digest: info.Digest, Bytes: info.Bytes, Files: info.Files}
	if ns, name := req.GetVolumeContext()[attrPodNamespace], req.GetVolumeContext()[attrPodName]; name != "" {
		t.Pod = ns + "/" + name
	}
	if err := n.ts.write(t); err != nil {
		return target{}, info, status.Errorf(codes.Internal, "volume %s: %v", req.GetVolumeId(), err)
	}
	d, err := openTarget(n.opt.KubeletDir, tp)
	if err == nil {
		_, err = d.bind(info.Path)
		d.Close()
	}
	if err != nil {
		n.ts.remove(tp)
		return target{}, info, status.Errorf(status.Code(targetStatus(err)), "volume %s: %v", req.GetVolumeId(), err)
	}
	return t, info, nil
}

// claim marks target path tp as being worked on until done is called; a
// second call for tp meanwhile fails with Aborted, as CSI asks.
func (n *Node) claim(tp string) (done func(), err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.busy[tp] {
		return nil, status.Errorf(codes.Aborted, "%s: an operation is in progress", tp)
	}
	n.busy[tp] = true
	return func() {
		n.mu.Lock()
		delete(n.busy, tp)
		n.mu.Unlock()
	}, nil
}

// releaseLocked starts the linger of digest d when no target uses it.
func (n *Node) releaseLocked(d string) {
	if n.refcount(d) == 0 {
		n.lingerLocked(d)
	}
}

// abandon undoes a failed publish's mount: a version this publish mounted
// and no target uses is unmounted now, so nothing is left behind. Call with
// n.mu held; it returns with n.mu released.
func (n *Node) abandon(info MountInfo) {
	k := infoKey(info)
	if !info.New || n.refcount(k) > 0 || n.unmounting[k] != nil {
		n.releaseLocked(k)
		n.mu.Unlock()
		return
	}
	if err := n.unmountUnlocking(k); err != nil {
		n.log.Warn("unmount after a failed publish", "key", k, "error", err.Error())
		n.mu.Lock()
		n.lingerLocked(k)
		n.mu.Unlock()
	}
}

// podCredentials returns the credential store for the access check and the
// credential for ref's registry to hand to the mounter: from the pod's
// docker config secret, else nil for both (the node's docker config).
func (n *Node) podCredentials(ctx context.Context, ref oci.Ref, secrets map[string]string) (credentials.Store, *credential, error) {
	cfg, ok := secrets[SecretDockerJSON]
	if !ok {
		return nil, nil, nil
	}
	store, err := credentials.NewMemoryStoreFromDockerConfig([]byte(cfg))
	if err != nil {
		return nil, nil, errors.New("not a docker config") // never echo the secret
	}
	c, err := store.Get(ctx, ref.Registry)
	if err != nil {
		return nil, nil, errors.New("unreadable credential")
	}
	return store, &credential{Username: c.Username, Password: c.Password, RefreshToken: c.RefreshToken, AccessToken: c.AccessToken}, nil
}

// NodeUnpublishVolume unbinds the target path and drops its reference; the
// last reference of a digest unmounts it after the linger. It acts only on
// targets this plugin recorded: any other path is left as it is.
func (n *Node) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := checkRequest(req.GetVolumeId(), "target path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	tp := req.GetTargetPath()
	if err := n.checkTargetPath(tp); err != nil {
		return nil, err
	}
	done, err := n.claim(tp)
	if err != nil {
		return nil, err
	}
	defer done()
	if w, ok := n.readWarm(tp); ok {
		if err := n.unpublishWarm(ctx, w); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: %v", req.GetVolumeId(), err)
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	t, known := n.ts.read(tp)
	if !known {
		// Not published here, or unpublished already: whatever is
		// there (a file, someone's own mount) is not ours to touch.
		// A dead bdnvol mount there (its record lost with the state
		// directory) is ours and serves nothing: it is removed, or
		// kubelet could never delete the directory.
		if err := n.clearDead(tp); err != nil {
			return nil, err
		}
		n.log.Info("unpublish of a target not recorded: nothing done", "volume_id", req.GetVolumeId(), "target", tp)
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	if err := n.unbindTarget(t); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", req.GetVolumeId(), err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ts.remove(tp)
	n.releaseLocked(targetKey(t))
	n.log.Info("unpublished", "volume_id", req.GetVolumeId(), "digest", t.Digest, "target", tp, "refs_left", n.refcount(targetKey(t)))
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetVolumeStats reports the volume's size: its bytes and its entries.
func (n *Node) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if err := checkRequest(req.GetVolumeId(), "volume path", req.GetVolumePath()); err != nil {
		return nil, err
	}
	p := req.GetVolumePath()
	t, ok := n.ts.read(p)
	if !ok || t.VolumeID != req.GetVolumeId() {
		return nil, status.Errorf(codes.NotFound, "volume %s is not published at %s", req.GetVolumeId(), p)
	}
	if m, mounted := mounts.At(p); !mounted || m.Digest != t.Digest {
		return nil, status.Errorf(codes.NotFound, "volume %s: %s is no longer mounted", req.GetVolumeId(), p)
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: t.Bytes, Used: t.Bytes},
		{Unit: csi.VolumeUsage_INODES, Total: t.Files, Used: t.Files},
	}}, nil
}

func (n *Node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{{
		Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_GET_VOLUME_STATS}},
	}}}, nil
}

func (n *Node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: n.opt.NodeID}, nil
}

// String names the node for logs.
func (n *Node) String() string { return fmt.Sprintf("bdnvol csi node %s", n.opt.NodeID) }

// indexKeys returns the PEM public keys of p, for the mounter to trust
// an index published beside a ModelPack model (modelpack.WithTrust).
func indexKeys(p signature.Policy) []string {
	var out []string
	for _, v := range p.Keys {
		if b, err := signature.PublicKeyPEM(v); err == nil {
			out = append(out, string(b))
		}
	}
	return out
}
