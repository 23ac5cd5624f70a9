package csi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
	"github.com/bdnvol/bdnvol/pkg/mounts"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/pull"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/signature"
	"github.com/bdnvol/bdnvol/pkg/warm"
	"github.com/bdnvol/bdnvol/pkg/warmstate"
)

// Volume attributes of a warm-state volume (docs/warm-state.md).
const (
	// AttrWarmstateKey makes the volume the warm state of the version ref
	// names for this key (k=v,...): the companion of that key read-only
	// beneath a writable layer of the pod's own, or an empty writable
	// directory when there is none.
	AttrWarmstateKey = "warmstateKey"
	// AttrWarmstatePublish "true": at unpublish, what the pod wrote is
	// published as the companion of the key, when there was none.
	AttrWarmstatePublish = "warmstatePublish"
)

// warmPublishTimeout bounds publishing a pod's cache at unpublish.
var warmPublishTimeout = 10 * time.Minute

// Defaults of the warm-state bounds (NodeOptions).
const (
	// DefaultWarmstateLowerTTL is how long an unused lower directory stays.
	DefaultWarmstateLowerTTL = time.Hour
	// DefaultWarmstateMaxBytes is the most a published upper layer holds.
	DefaultWarmstateMaxBytes = 64 << 30
	// maxUpperEntries bounds the entries of an upper layer published.
	maxUpperEntries = 1 << 20
)

// warmTarget is a published warm-state volume: its record in the state
// directory (apart from the version targets, which the mounter's
// refcounts are kept by).
type warmTarget struct {
	VolumeID  string             `json:"volume_id"`
	Path      string             `json:"target_path"`
	Ref       string             `json:"ref"`
	Version   ocispec.Descriptor `json:"version"`
	Key       string             `json:"key"`
	Companion string             `json:"companion,omitempty"` // the companion mounted beneath; "" for none
	Publish   bool               `json:"publish,omitempty"`
	ReadOnly  bool               `json:"read_only,omitempty"` // the lower bound read-only, no upper
	Dir       string             `json:"dir"`                 // holds upper/ and work/
	Pod       string             `json:"pod,omitempty"`
}

func (n *Node) warmDir(parts ...string) string {
	return filepath.Join(append([]string{n.opt.StateDir, "warm"}, parts...)...)
}

func (n *Node) warmRecord(tp string) string {
	return n.warmDir("targets", mounts.Key(tp)+".json")
}

func (n *Node) readWarm(tp string) (warmTarget, bool) {
	var w warmTarget
	b, err := os.ReadFile(n.warmRecord(tp))
	if err != nil || json.Unmarshal(b, &w) != nil || w.Path != tp {
		return warmTarget{}, false
	}
	return w, true
}

func (n *Node) writeWarm(w warmTarget) error {
	if err := os.MkdirAll(n.warmDir("targets"), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(w)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(n.warmRecord(w.Path), b, 0o600)
}

// publishWarm publishes a warm-state volume at the target: the companion
// of the key (pulled once per node into a read-only lower directory) under
// an overlay whose upper and work directories are this target's own, on
// the node's disk. A pod's writes land in its upper directory only.
func (n *Node) publishWarm(ctx context.Context, req *csi.NodePublishVolumeRequest, ref oci.Ref, policy signature.Policy) (*csi.NodePublishVolumeResponse, error) {
	vid, tp := req.GetVolumeId(), req.GetTargetPath()
	key, err := warmstate.ParseKey(req.GetVolumeContext()[AttrWarmstateKey])
	if err == nil {
		key, err = key.Complete(n.opt.WarmstateFields)
	}
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: %s: %v", vid, AttrWarmstateKey, err)
	}
	publish := false
	switch v := req.GetVolumeContext()[AttrWarmstatePublish]; v {
	case "", "false":
	case "true":
		publish = true
	default:
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: %s: %q is neither true nor false", vid, AttrWarmstatePublish, v)
	}
	if publish && !n.opt.WarmstatePublish {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: %s: this node does not publish pods' caches (bdnvol csi node --warmstate-publish)", vid, AttrWarmstatePublish)
	}
	if publish && req.GetReadonly() {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: %s on a read-only volume: it has nothing to publish", vid, AttrWarmstatePublish)
	}
	done, err := n.claim(tp)
	if err != nil {
		return nil, err
	}
	defer done()
	if w, ok := n.readWarm(tp); ok {
		if fs, mounted := mountAt(tp); mounted && (w.ReadOnly || fs == "overlay") {
			if w.VolumeID != vid {
				return nil, status.Errorf(codes.AlreadyExists, "%s: already publishes volume %s", tp, w.VolumeID)
			}
			return &csi.NodePublishVolumeResponse{}, nil
		}
		os.RemoveAll(w.Dir)
		os.Remove(n.warmRecord(tp))
	}
	if err := n.checkTarget(tp); err != nil {
		return nil, err
	}
	creds, _, err := n.podCredentials(ctx, ref, req.GetSecrets())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: %s: %v", vid, SecretDockerJSON, err)
	}
	opt := n.opt.OCI
	opt.Credentials = creds
	opt.Retry = oci.RetryPolicy{MaxAttempts: 3, Base: 100 * time.Millisecond, MaxWait: time.Second}
	rctx, cancel := context.WithTimeout(ctx, mounterCallTimeout)
	defer cancel()
	repo, err := oci.Open(rctx, ref, opt)
	if err != nil {
		return nil, status.Errorf(codeOf(kindOf(err)), "volume %s: %s: %v", vid, ref, err)
	}
	desc, err := signature.Resolve(rctx, repo, ref, policy)
	if errors.Is(err, signature.ErrRefused) {
		return nil, status.Errorf(codes.PermissionDenied, "volume %s: %v", vid, err)
	}
	if err != nil {
		return nil, status.Errorf(codeOf(kindOf(err)), "volume %s: %v", vid, err)
	}
	w := warmTarget{VolumeID: vid, Path: tp, Ref: ref.String(), Key: key.String(), Publish: publish, ReadOnly: req.GetReadonly(),
		Dir:     n.warmDir("pods", mounts.Key(tp)),
		Version: ocispec.Descriptor{MediaType: desc.MediaType, Digest: desc.Digest, Size: desc.Size}}
	if ns, name := req.GetVolumeContext()[attrPodNamespace], req.GetVolumeContext()[attrPodName]; name != "" {
		w.Pod = ns + "/" + name
	}
	lower := n.warmDir("empty")
	comp, err := warmstate.Find(rctx, repo, desc, key, policy)
	if errors.Is(err, signature.ErrRefused) {
		// Companions of the key, none signed as the policy asks: none
		// is used, and the pod compiles for itself (a cache never stops a
		// pod that can do without it).
		n.log.Warn("warm state: no companion of the key passes the signature policy; none used", "volume_id", vid, "key", key.String(), "error", err.Error())
		err = warmstate.ErrNotFound
	}
	switch {
	case errors.Is(err, warmstate.ErrNotFound):
		if err := os.MkdirAll(lower, 0o755); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: %v", vid, err)
		}
	case err != nil:
		return nil, status.Errorf(codeOf(kindOf(err)), "volume %s: warm state: %v", vid, err)
	default:
		w.Companion = comp.Desc.Digest.String()
		if lower, err = n.warmLower(rctx, ref, opt, comp); err != nil {
			return nil, status.Errorf(codeOf(kindOf(err)), "volume %s: warm state %s: %v", vid, comp.Desc.Digest, err)
		}
	}
	upper, work := filepath.Join(w.Dir, "upper"), filepath.Join(w.Dir, "work")
	os.RemoveAll(w.Dir)
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: %v", vid, err)
		}
	}
	// The merged root takes the upper directory's owner and mode: the
	// pod's own, writable whatever user it runs as.
	if err := os.Chmod(upper, 0o777); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", vid, err)
	}
	if err := n.writeWarm(w); err != nil {
		os.RemoveAll(w.Dir)
		return nil, status.Errorf(codes.Internal, "volume %s: %v", vid, err)
	}
	d, err := openTarget(n.opt.KubeletDir, tp)
	if err == nil {
		if w.ReadOnly {
			// CSI's readonly: the companion as it is, bound read-only.
			_, err = d.bind(lower)
		} else {
			err = d.overlay(lower, upper, work)
		}
		d.Close()
	}
	if err != nil {
		os.Remove(n.warmRecord(tp))
		os.RemoveAll(w.Dir)
		return nil, status.Errorf(status.Code(targetStatus(err)), "volume %s: %v", vid, err)
	}
	n.log.Info("published warm state", "volume_id", vid, "ref", w.Ref, "key", w.Key, "companion", w.Companion, "target", tp, "pod", w.Pod)
	return &csi.NodePublishVolumeResponse{}, nil
}

// warmLower returns the directory holding companion c's tree, pulling it
// there first when the node has not yet: a directory per companion
// digest, renamed into place whole, never written again.
func (n *Node) warmLower(ctx context.Context, ref oci.Ref, opt oci.Options, c *warmstate.Companion) (string, error) {
	dir := n.warmDir("lower", c.Desc.Digest.Encoded())
	mu := lowerLock(dir)
	mu.Lock()
	defer mu.Unlock()
	if st, err := os.Stat(dir); err == nil && st.IsDir() {
		// Its time is its last use: sweepWarmLowers keeps it a TTL more.
		now := time.Now()
		os.Chtimes(dir, now, now)
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", err
	}
	// A staging directory of its own name: a publish that timed out left
	// what it pulled, and the next one (kubelet retries) resumes there.
	tmp := filepath.Join(filepath.Dir(dir), ".pull-"+c.Desc.Digest.Encoded())
	tree := ref
	tree.Tag, tree.Digest = "", c.Tree.Digest
	if _, err := pull.Pull(ctx, tree, tmp, pull.Options{OCI: opt, CacheDir: n.warmDir("cache"), Cache: pull.CacheModeOf(false, true)}); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	now := time.Now()
	os.Chtimes(tmp, now, now)
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// sweepWarmLowers removes the lower directories of companions (and the
// staging directories of their pulls) that no warm-state volume mounted on
// this node uses, the warm list does not name, and that none has used for
// the lower TTL: a directory's
// time is its last use (a publish, or the unpublish of a pod that used
// it). A record that cannot be read stops the sweep: what it uses is not
// known.
func (n *Node) sweepWarmLowers() {
	ttl := n.opt.WarmstateLowerTTL
	if ttl <= 0 {
		ttl = DefaultWarmstateLowerTTL
	}
	used := map[string]bool{}
	recs, err := os.ReadDir(n.warmDir("targets"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		n.log.Warn("warm state: lower directories not swept", "error", err.Error())
		return
	}
	for _, e := range recs {
		var w warmTarget
		b, err := os.ReadFile(n.warmDir("targets", e.Name()))
		if err == nil {
			err = json.Unmarshal(b, &w)
		}
		if err != nil {
			n.log.Warn("warm state: lower directories not swept: a record is unreadable", "record", e.Name(), "error", err.Error())
			return
		}
		if _, mounted := mountAt(w.Path); mounted && w.Companion != "" {
			used[strings.TrimPrefix(w.Companion, "sha256:")] = true
		}
	}
	n.listedMu.Lock()
	for _, hex := range n.listed {
		used[hex] = true
	}
	n.listedMu.Unlock()
	lowers, err := os.ReadDir(n.warmDir("lower"))
	if err != nil {
		return
	}
	for _, e := range lowers {
		hex := strings.TrimPrefix(e.Name(), ".pull-")
		if used[hex] {
			continue
		}
		mu := lowerLock(n.warmDir("lower", hex))
		if !mu.TryLock() {
			continue // being pulled or used now
		}
		dir := n.warmDir("lower", e.Name())
		if st, err := os.Lstat(dir); err == nil && time.Since(st.ModTime()) > ttl {
			if err := os.RemoveAll(dir); err != nil {
				n.log.Warn("warm state: lower directory not removed", "dir", dir, "error", err.Error())
			} else {
				n.log.Info("warm state: removed an unused lower directory", "dir", dir, "unused_for", time.Since(st.ModTime()).Round(time.Second).String())
			}
		}
		mu.Unlock()
	}
}

// lowerLocks serialises pulls of one companion's lower directory.
var lowerLocks sync.Map // dir -> *sync.Mutex

func lowerLock(dir string) *sync.Mutex {
	mu, _ := lowerLocks.LoadOrStore(dir, &sync.Mutex{})
	return mu.(*sync.Mutex)
}

// unpublishWarm unmounts a warm-state volume, publishes what the pod
// wrote when it asked and there was no companion of the key, and removes
// its upper and work directories.
func (n *Node) unpublishWarm(ctx context.Context, w warmTarget) error {
	d, err := openTarget(n.opt.KubeletDir, w.Path)
	if err == nil {
		err = d.unbind()
		d.Close()
	}
	if err != nil {
		return err
	}
	upper := filepath.Join(w.Dir, "upper")
	if w.Publish && w.Companion == "" && !emptyDir(upper) {
		n.publishUpper(ctx, w, upper)
	}
	os.RemoveAll(w.Dir)
	os.Remove(n.warmRecord(w.Path))
	if w.Companion != "" {
		// Its last use: the lower stays a TTL from now.
		now := time.Now()
		os.Chtimes(n.warmDir("lower", strings.TrimPrefix(w.Companion, "sha256:")), now, now)
	}
	n.log.Info("unpublished warm state", "volume_id", w.VolumeID, "target", w.Path, "key", w.Key)
	n.sweepWarmLowers()
	return nil
}

// upperSize returns the bytes of the regular files under upper, or an
// error once they pass max bytes or maxUpperEntries entries.
func upperSize(upper string, max int64) (int64, error) {
	var size int64
	entries := 0
	err := filepath.WalkDir(upper, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if entries++; entries > maxUpperEntries {
			return fmt.Errorf("more than %d entries", maxUpperEntries)
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if size += fi.Size(); size > max {
				return fmt.Errorf("more than %d bytes, the node's bound (--warmstate-max-bytes)", max)
			}
		}
		return nil
	})
	return size, err
}

// publishUpper publishes the upper directory as the companion of w's key,
// with the node's credentials (unpublish carries no secrets). A failure
// is logged: the pod is gone either way, and a later one compiles again.
func (n *Node) publishUpper(ctx context.Context, w warmTarget, upper string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), warmPublishTimeout)
	defer cancel()
	err := func() error {
		max := n.opt.WarmstateMaxBytes
		if max <= 0 {
			max = DefaultWarmstateMaxBytes
		}
		if _, err := upperSize(upper, max); err != nil {
			return fmt.Errorf("the pod's layer: %w", err)
		}
		key, err := warmstate.ParseKey(w.Key)
		if err != nil {
			return err
		}
		ref, err := oci.ParseRef(w.Ref)
		if err != nil {
			return err
		}
		repo, err := oci.Open(ctx, ref, n.opt.OCI)
		if err != nil {
			return err
		}
		p, err := warmstate.Publish(ctx, repo, w.Version, key, push.DirSource(upper), warmstate.PublishOptions{
			Holder: strings.TrimSuffix(n.opt.NodeID+"/"+w.Pod, "/"), Repo: signature.RepoName(ref),
		})
		if err != nil {
			return err
		}
		n.log.Info("published the pod's warm state", "target", w.Path, "key", w.Key, "companion", p.Companion.Desc.Digest,
			"existed", p.Existed, "lost", p.Lost)
		return nil
	}()
	if err != nil {
		n.log.Warn("warm state not published", "target", w.Path, "key", w.Key, "error", err.Error())
	}
}

func emptyDir(dir string) bool {
	es, err := os.ReadDir(dir)
	return err == nil && len(es) == 0
}

// overlayOptions is the mount data of an overlay; paths holding a comma,
// a colon or a backslash (overlayfs's separators) are refused.
func overlayOptions(lower, upper, work string) (string, error) {
	for _, p := range []string{lower, upper, work} {
		if strings.ContainsAny(p, ",:\\") {
			return "", fmt.Errorf("overlay directory %q holds a comma, colon or backslash", p)
		}
	}
	return "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work, nil
}

// DefaultWarmListInterval is how often the node plugin reads its warm list.
const DefaultWarmListInterval = time.Minute

// keepCompanionsWarm pulls the companions the warm list names (`REF
// warmstate:KEY`, the key completed with the node's fields) into their
// lower directories, every WarmListInterval until ctx ends: the first pod
// of the key on this node then finds its cache here. A listed companion's
// directory is kept while it is listed; an entry that fails keeps the
// directory it had.
func (n *Node) keepCompanionsWarm(ctx context.Context) {
	every := n.opt.WarmListInterval
	if every <= 0 {
		every = DefaultWarmListInterval
	}
	failed := map[string]string{} // entry -> the error last logged
	for {
		n.warmListRound(ctx, failed)
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func (n *Node) warmListRound(ctx context.Context, failed map[string]string) {
	b, err := os.ReadFile(n.opt.WarmList)
	var es []warm.CompanionEntry
	if err == nil {
		es, err = warm.ParseCompanions(b)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		n.log.Warn("warm list unreadable: its companions kept as they were", "list", n.opt.WarmList, "error", err.Error())
		return
	}
	n.listedMu.Lock()
	before := n.listed
	n.listedMu.Unlock()
	listed := map[string]string{}
	for _, e := range es {
		id := e.Ref + "\x00" + e.Key
		hex, err := n.warmCompanion(ctx, e)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if failed[id] != err.Error() {
				n.log.Warn("warm list companion not warmed", "ref", e.Ref, "key", e.Key, "error", err.Error())
				failed[id] = err.Error()
			}
			if h, ok := before[id]; ok {
				listed[id] = h
			}
			continue
		}
		if _, ok := failed[id]; ok || before[id] != hex {
			n.log.Info("warm list companion on the node", "ref", e.Ref, "key", e.Key, "companion", "sha256:"+hex)
		}
		delete(failed, id)
		listed[id] = hex
	}
	n.listedMu.Lock()
	n.listed = listed
	n.listedMu.Unlock()
}

// warmCompanion pulls the companion entry e names into its lower
// directory (unless there) with the node's credentials and returns its
// digest's hex. No signature policy applies here: a pod's publish checks
// the companion against its own before mounting it.
func (n *Node) warmCompanion(ctx context.Context, e warm.CompanionEntry) (string, error) {
	key, err := warmstate.ParseKey(e.Key)
	if err == nil {
		key, err = key.Complete(n.opt.WarmstateFields)
	}
	if err != nil {
		return "", err
	}
	ref, err := oci.ParseRef(e.Ref)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, warmPublishTimeout)
	defer cancel()
	opt := n.opt.OCI
	repo, err := oci.Open(ctx, ref, opt)
	if err != nil {
		return "", err
	}
	desc, err := oci.Resolve(ctx, repo, ref)
	if err != nil {
		return "", err
	}
	c, err := warmstate.Find(ctx, repo, desc, key, signature.Policy{})
	if err != nil {
		return "", err
	}
	if _, err := n.warmLower(ctx, ref, opt, c); err != nil {
		return "", err
	}
	return c.Desc.Digest.Encoded(), nil
}
