package csi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/credentials"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/mounts"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/signature"
	"github.com/bdnvol/bdnvol/pkg/warm"
)

// MounterOptions configure a Mounter.
type MounterOptions struct {
	MountsDir    string            // where the per-digest FUSE mounts live
	Cache        *chunkcache.Cache // the node's shared chunk cache
	OCI          oci.Options       // how registries are reached (Credentials is set per mount)
	Mirrors      oci.MirrorConfig
	Jobs         int           // concurrent background fetches per mount
	FetchTimeout time.Duration // a read fails when a chunk takes longer
	Logger       *slog.Logger
	// Wrap instruments registry fetchers (metrics); nil for none.
	Wrap func(source, host string, f content.Fetcher) content.Fetcher
	// Warmer, when set, is served at GET /v1/warm.
	Warmer *warm.Warmer
	// Profile is the startup profile mode of every mount
	// (profile.Options.Mode); "" uses none.
	Profile string
	// Handoff is the socket where a successor asks this mounter for its
	// mounts, and where NewMounter asks a predecessor for its own ("" for
	// no handoff).
	Handoff string
	// FDHolder is the socket of the fd holder (ServeFDHolder) that keeps
	// a copy of each mount's descriptor ("" for none).
	FDHolder string
	// Peers, when set, puts the cluster's peers in front of every mount's
	// registry (pkg/peer; origin.Options.Peers).
	Peers func(ref oci.Ref, src content.Fetcher) content.Fetcher
}

// Mounter holds one FUSE mount per version (registry, repository and
// digest), all reading through one cache.
type Mounter struct {
	opt MounterOptions
	log *slog.Logger

	mu       sync.Mutex               // guards the maps and handedOver
	served   map[string]*mounted      // by mount key (see MountKey)
	inflight map[string]chan struct{} // mount keys being mounted; closed when done
	// handedOver is set once a successor asked for the mounts: new mounts
	// are refused.
	handedOver bool
	// gaveAway is set once the mounts to hand over were taken: a mount in
	// progress that finishes later was not handed over, and is undone.
	gaveAway bool
	holder   *holderClient // nil without an fd holder
}

// MountKey is what mounts are keyed by: REGISTRY/REPOSITORY@DIGEST, the
// registry and repository a request names and the digest it pins. The same
// digest in two repositories is two mounts, each fetching with credentials
// that were checked against its own repository.
func MountKey(ref oci.Ref) string {
	return ref.Registry + "/" + ref.Repository + "@" + ref.Digest.String()
}

// keyOfPinned is the mount key of a digest-pinned reference, or "" when s
// is not one.
func keyOfPinned(s string) string {
	r, err := oci.ParseRef(s)
	if err != nil || r.Digest == "" || r.Layout != "" {
		return ""
	}
	return MountKey(r)
}

// mountpointName is the directory of ref's mount under the mounts
// directory: the digest's hex and a short hash of registry/repository.
func mountpointName(ref oci.Ref) string {
	return ref.Digest.Encoded() + "-" + digest.FromString(ref.Registry + "/" + ref.Repository).Encoded()[:12]
}

// mounted is one version served by the mounter.
type mounted struct {
	info     MountInfo
	conn     *lazy.Conn
	vol      *lazy.Volume
	held     heldMount          // what a successor or the fd holder needs
	inHolder bool               // the fd holder has its descriptor (guarded by Mounter.mu)
	stop     context.CancelFunc // stops its prefetch
	lease    func()             // drops the cache's record that it is mounted
}

// NewMounter returns a mounter. It first takes over the mounts of a
// predecessor still running (opt.Handoff) and those the fd holder keeps
// (opt.FDHolder), and then removes the mounts a previous mounter left
// under opt.MountsDir that it did not take over (their server is gone).
func NewMounter(opt MounterOptions) (*Mounter, error) {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if abs, err := filepath.Abs(opt.MountsDir); err == nil && opt.MountsDir != "" {
		opt.MountsDir = abs // mountpoints handed over are confined to it
	}
	if err := os.MkdirAll(opt.MountsDir, 0o755); err != nil {
		return nil, fmt.Errorf("mounts dir: %w", err)
	}
	m := &Mounter{opt: opt, log: opt.Logger, served: map[string]*mounted{}, inflight: map[string]chan struct{}{}}
	if opt.FDHolder != "" {
		m.holder = &holderClient{path: opt.FDHolder}
	}
	taken := m.takeOver(context.Background())
	left, _ := mounts.Under(filepath.Clean(opt.MountsDir))
	for _, l := range left {
		if taken[l.Mountpoint] {
			continue
		}
		if err := mounts.Detach(l.Mountpoint); err != nil {
			m.log.Warn("stale mount not removed", "path", l.Mountpoint, "error", err.Error())
			continue
		}
		m.log.Info("removed a stale mount", "path", l.Mountpoint, "digest", l.Digest)
	}
	return m, nil
}

// Mount returns the mount of the version ref pins (its registry,
// repository and digest), mounting it first when this mounter does not
// serve it yet.
func (m *Mounter) Mount(ctx context.Context, req mountRequest) (MountInfo, error) {
	ref, err := oci.ParseRef(req.Ref)
	if err != nil || ref.Digest == "" || ref.Layout != "" {
		return MountInfo{}, &kindError{kindInvalid, fmt.Errorf("%s: not a registry reference pinned by digest", req.Ref)}
	}
	key := MountKey(ref)
	for {
		m.mu.Lock()
		if m.handedOver {
			m.mu.Unlock()
			return MountInfo{}, &kindError{kindUnavailable, errors.New("this mounter handed its mounts over to a successor")}
		}
		if s, ok := m.served[key]; ok {
			select {
			case <-s.conn.Done():
				delete(m.served, key) // unmounted behind our back
				s.lease()
			default:
				m.mu.Unlock()
				return s.info, nil
			}
		}
		if wait, ok := m.inflight[key]; ok {
			// Another request is mounting this version: wait for it.
			m.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return MountInfo{}, ctx.Err()
			}
		}
		done := make(chan struct{})
		m.inflight[key] = done
		m.mu.Unlock()
		info, err := m.mountNew(ctx, ref, req)
		m.mu.Lock()
		delete(m.inflight, key)
		close(done)
		m.mu.Unlock()
		return info, err
	}
}

// mountNew opens and mounts the version ref pins, which no mount serves.
func (m *Mounter) mountNew(ctx context.Context, ref oci.Ref, req mountRequest) (MountInfo, error) {
	prefetch, err := mounts.Prefetcher(req.Prefetch)
	if err != nil {
		return MountInfo{}, &kindError{kindInvalid, fmt.Errorf("prefetch %q: %w", req.Prefetch, err)}
	}
	vol, pinned, err := m.open(ctx, ref, req.Auth, req.IndexKeys)
	if err != nil {
		return MountInfo{}, err
	}
	mp := filepath.Join(m.opt.MountsDir, mountpointName(ref))
	if err := os.MkdirAll(mp, 0o755); err != nil && !mounts.NotConnected(mp) {
		vol.Close()
		return MountInfo{}, fmt.Errorf("mount %s: %w", pinned, err)
	}
	if _, mounted := mounts.At(mp); mounted || mounts.NotConnected(mp) {
		// Left by an earlier mounter of this version: its server is gone.
		if err := mounts.Detach(mp); err != nil {
			vol.Close()
			return MountInfo{}, err
		}
	}
	conn, err := lazy.MountConn(mp, vol, lazy.ConnOptions{AllowOther: true})
	if err != nil {
		vol.Close()
		return MountInfo{}, fmt.Errorf("mount %s on %s: %w", pinned, mp, err)
	}
	held := heldMount{Key: MountKey(ref), Ref: req.Ref, Mountpoint: mp, Prefetch: req.Prefetch, Auth: req.Auth, IndexKeys: req.IndexKeys, Init: conn.Init()}
	info, ok := m.add(ref, held, vol, pinned, conn, prefetch)
	if !ok {
		// Mounted after the handoff took the mounts: the successor does not
		// know it, and this mounter is going.
		err := conn.Unmount(stopGrace)
		vol.Close()
		os.Remove(mp)
		m.log.Warn("mounted after the handoff: undone, the request is to be retried", "ref", pinned, "path", mp)
		return MountInfo{}, &kindError{kindUnavailable, errors.Join(fmt.Errorf("%s: this mounter handed its mounts over to a successor while mounting it", pinned), err)}
	}
	m.log.Info("mounted", "ref", pinned, "digest", info.Digest, "path", mp)
	info.New = true
	return info, nil
}

// open opens the version ref pins, fetching with auth when not nil.
func (m *Mounter) open(ctx context.Context, ref oci.Ref, cred *credential, indexKeys []string) (*lazy.Volume, string, error) {
	opt := m.opt.OCI
	if cred != nil {
		store := credentials.NewMemoryStore()
		store.Put(ctx, ref.Registry, auth.Credential{Username: cred.Username, Password: cred.Password,
			RefreshToken: cred.RefreshToken, AccessToken: cred.AccessToken})
		opt.Credentials = store
	}
	var trust signature.Policy
	for _, k := range indexKeys {
		v, err := signature.ParsePublicKey([]byte(k))
		if err != nil {
			return nil, "", &kindError{kindInvalid, fmt.Errorf("index key: %w", err)}
		}
		trust.Keys = append(trust.Keys, v)
	}
	logf := func(format string, args ...any) { m.log.Info(fmt.Sprintf(format, args...), "ref", ref.String()) }
	return mounts.Open(ctx, ref, mounts.OpenOptions{OCI: opt, Mirrors: m.opt.Mirrors, Cache: m.opt.Cache, Jobs: m.opt.Jobs, FetchTimeout: m.opt.FetchTimeout, Wrap: m.opt.Wrap,
		Profile: m.profileOptions(), IndexTrust: trust, Logf: logf, Peers: m.opt.Peers})
}

// add records a mount served by conn, gives its descriptor to the fd
// holder and starts its prefetch. It records nothing and returns false
// when the mounts were handed over already (the caller undoes the mount).
func (m *Mounter) add(ref oci.Ref, held heldMount, vol *lazy.Volume, pinned string, conn *lazy.Conn, prefetch func(context.Context, *lazy.Volume) error) (MountInfo, bool) {
	idx := vol.Version().Index
	info := MountInfo{Digest: ref.Digest.String(), Ref: pinned, Key: held.Key, Path: held.Mountpoint, Bytes: idx.Bytes(), Files: int64(idx.Len())}
	lease := m.hold(vol, held.Ref, pinned, held.Mountpoint)
	pctx, stop := context.WithCancel(context.Background())
	s := &mounted{info: info, conn: conn, vol: vol, held: held, stop: stop, lease: lease}
	m.mu.Lock()
	if m.gaveAway {
		m.mu.Unlock()
		stop()
		lease()
		return MountInfo{}, false
	}
	m.served[held.Key] = s
	m.mu.Unlock()
	m.putHolder(s)
	if prefetch != nil {
		go func() {
			if err := prefetch(pctx, vol); err != nil && pctx.Err() == nil {
				m.log.Warn("prefetch failed", "digest", info.Digest, "error", err.Error())
			}
		}()
	}
	return info, true
}

// Unmount unmounts the version with mount key key (see MountKey), if
// served.
func (m *Mounter) Unmount(ctx context.Context, key string) error {
	m.mu.Lock()
	s, ok := m.served[key]
	delete(m.served, key)
	m.mu.Unlock()
	if !ok {
		return nil
	}
	s.stop()
	m.dropHolder(key)
	if err := s.conn.Unmount(unmountBusy); err != nil {
		return err
	}
	s.vol.Close()
	s.lease()
	os.Remove(s.info.Path)
	m.log.Info("unmounted", "key", key, "path", s.info.Path)
	return nil
}

// UnmountDigest unmounts every version of digest d, in any repository:
// what a node plugin that keys by digest alone (before mount keys) asks.
func (m *Mounter) UnmountDigest(ctx context.Context, d digest.Digest) error {
	var errs []error
	for _, i := range m.List() {
		if i.Digest == d.String() {
			errs = append(errs, m.Unmount(ctx, i.Key))
		}
	}
	return errors.Join(errs...)
}

// List returns the mounts served now.
func (m *Mounter) List() []MountInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]MountInfo, 0, len(m.served))
	for _, s := range m.served {
		out = append(out, s.info)
	}
	return out
}

// stopGrace bounds each step of Close's unmount of one mount: a busy
// mount is detached after it, a server that pods' bind mounts keep going
// is aborted after it.
const stopGrace = 2 * time.Second

// unmountBusy bounds Unmount's wait for a busy mount, and then for its
// server to end.
const unmountBusy = 5 * time.Second

// Close stops serving every mount at once. A mount whose descriptor the fd
// holder keeps stays mounted, its requests queued for the next mounter;
// every other mount is unmounted promptly: a stop must not wait for pods
// that still bind them.
func (m *Mounter) Close() error {
	leave := m.holder != nil && m.holder.ping() == nil
	m.mu.Lock()
	all := m.served
	m.served = map[string]*mounted{}
	inHolder := map[string]bool{}
	for key, s := range all {
		inHolder[key] = s.inHolder
	}
	m.mu.Unlock()
	errs := make(chan error, len(all))
	for key, s := range all {
		go func() {
			s.stop()
			if leave && inHolder[key] {
				s.conn.Close()
				s.vol.Close()
				s.lease()
				m.log.Info("left to the fd holder at stop", "mount", key, "path", s.info.Path)
				errs <- nil
				return
			}
			m.dropHolder(key)
			err := s.conn.Unmount(stopGrace)
			s.vol.Close()
			s.lease()
			os.Remove(s.info.Path)
			if err != nil {
				m.log.Warn("unmount at stop", "mount", key, "path", s.info.Path, "error", err.Error())
			} else {
				m.log.Info("unmounted at stop", "mount", key, "path", s.info.Path)
			}
			errs <- err
		}()
	}
	var out []error
	for range all {
		out = append(out, <-errs)
	}
	return errors.Join(out...)
}

// kindError is an error with the kind the node plugin maps to a CSI code.
type kindError struct {
	kind string
	err  error
}

func (e *kindError) Error() string { return e.err.Error() }
func (e *kindError) Unwrap() error { return e.err }

// Handler is the mounter's HTTP API.
func (m *Mounter) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/mount", func(w http.ResponseWriter, r *http.Request) {
		var req mountRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, &kindError{kindInvalid, fmt.Errorf("mount request: %w", err)})
			return
		}
		info, err := m.Mount(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		json.NewEncoder(w).Encode(info)
	})
	mux.HandleFunc("POST /v1/unmount", func(w http.ResponseWriter, r *http.Request) {
		var req unmountRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, &kindError{kindInvalid, fmt.Errorf("unmount request: %w", err)})
			return
		}
		var err error
		if req.Ref != "" {
			key := keyOfPinned(req.Ref)
			if key == "" {
				writeError(w, &kindError{kindInvalid, fmt.Errorf("unmount %q: not a registry reference pinned by digest", req.Ref)})
				return
			}
			err = m.Unmount(r.Context(), key)
		} else {
			d, perr := digest.Parse(req.Digest)
			if perr != nil {
				writeError(w, &kindError{kindInvalid, fmt.Errorf("unmount %q: %w", req.Digest, perr)})
				return
			}
			err = m.UnmountDigest(r.Context(), d)
		}
		if err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/mounts", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(m.List())
	})
	if m.opt.Warmer != nil {
		mux.Handle("GET /v1/warm", m.opt.Warmer.Handler())
	}
	return mux
}

func writeError(w http.ResponseWriter, err error) {
	kind := kindOf(err)
	var ke *kindError
	if errors.As(err, &ke) {
		kind = ke.kind
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnprocessableEntity)
	json.NewEncoder(w).Encode(apiError{Kind: kind, Message: err.Error()})
}

// Listen listens on the unix socket at path, replacing a stale one (or a
// predecessor's: closing the listener leaves the path alone). The socket
// is made 0600, whatever the umask: only root may call it.
func Listen(path string) (net.Listener, error) {
	path = strings.TrimPrefix(path, "unix://")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	// A successor may have replaced the socket by now: closing must not
	// remove its socket.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	return l, nil
}
