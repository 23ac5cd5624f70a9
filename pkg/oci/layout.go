package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/oci"
)

// indexLockName is the lock file that serialises changes to a layout's
// index.json between processes.
const indexLockName = ".bdnvol-index.lock"

// layoutStore is an OCI image layout that concurrent bdnvol processes can
// share. Blobs go straight to oras-go's Storage (temporary file, then
// rename). Every change to index.json (pushing a manifest, tagging,
// deleting) happens under an exclusive file lock on a freshly loaded
// index, so two pushes never lose each other's tags; reads load the index
// under a shared lock and reuse it until index.json changes.
type layoutStore struct {
	root string
	*oci.Storage

	mu     sync.Mutex
	cached *oci.Store
	stamp  [2]int64 // index.json mtime and size when cached was loaded
}

var _ Target = (*layoutStore)(nil)

func openLayout(ctx context.Context, root string, create bool) (*layoutStore, error) {
	s := &layoutStore{root: root}
	how := syscall.LOCK_SH
	if create {
		how = syscall.LOCK_EX // loading writes oci-layout and index.json when missing
	}
	if err := s.locked(ctx, how, func(*oci.Store) error { return nil }); err != nil {
		return nil, err
	}
	st, err := oci.NewStorage(root)
	if err != nil {
		return nil, err
	}
	s.Storage = st
	return s, nil
}

// locked runs fn on a freshly loaded store while holding the index lock
// (exclusive or shared).
func (s *layoutStore) locked(ctx context.Context, how int, fn func(*oci.Store) error) error {
	if how == syscall.LOCK_EX {
		if err := os.MkdirAll(s.root, 0o755); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(filepath.Join(s.root, indexLockName), os.O_CREATE|os.O_RDWR, 0o644)
	switch {
	case err == nil:
		defer f.Close()
		if err := syscall.Flock(int(f.Fd()), how); err != nil {
			return fmt.Errorf("lock %s: %w", s.root, err)
		}
		defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	case how == syscall.LOCK_SH && (errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS)):
		// A layout we may only read (read-only file system, another
		// user's directory): nobody here can change it, so read unlocked.
	default:
		return err
	}
	st, err := oci.NewWithContext(ctx, s.root)
	if err != nil {
		return err
	}
	st.AutoGC = false
	if err := fn(st); err != nil {
		return err
	}
	s.mu.Lock()
	s.cached, s.stamp = st, s.indexStamp()
	s.mu.Unlock()
	return nil
}

func (s *layoutStore) indexStamp() [2]int64 {
	fi, err := os.Stat(filepath.Join(s.root, ocispec.ImageIndexFile))
	if err != nil {
		return [2]int64{}
	}
	return [2]int64{fi.ModTime().UnixNano(), fi.Size()}
}

// read returns a store whose index is current.
func (s *layoutStore) read(ctx context.Context) (*oci.Store, error) {
	s.mu.Lock()
	st, stamp := s.cached, s.stamp
	s.mu.Unlock()
	if st != nil && stamp == s.indexStamp() && stamp != [2]int64{} {
		return st, nil
	}
	err := s.locked(ctx, syscall.LOCK_SH, func(fresh *oci.Store) error { st = fresh; return nil })
	return st, err
}

func (s *layoutStore) write(ctx context.Context, fn func(*oci.Store) error) error {
	return s.locked(ctx, syscall.LOCK_EX, fn)
}

// Push stores a blob, or a manifest and records it in index.json.
func (s *layoutStore) Push(ctx context.Context, desc ocispec.Descriptor, r io.Reader) error {
	if !isManifest(desc.MediaType) {
		return s.Storage.Push(ctx, desc, r)
	}
	return s.write(ctx, func(st *oci.Store) error { return st.Push(ctx, desc, r) })
}

// Resolve returns the descriptor a tag or digest names.
func (s *layoutStore) Resolve(ctx context.Context, ref string) (ocispec.Descriptor, error) {
	st, err := s.read(ctx)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	return st.Resolve(ctx, ref)
}

// Tag points ref at desc.
func (s *layoutStore) Tag(ctx context.Context, desc ocispec.Descriptor, ref string) error {
	return s.write(ctx, func(st *oci.Store) error { return st.Tag(ctx, desc, ref) })
}

// Untag removes the tag ref.
func (s *layoutStore) Untag(ctx context.Context, ref string) error {
	return s.write(ctx, func(st *oci.Store) error { return st.Untag(ctx, ref) })
}

// Delete removes a blob or a manifest (and its tags).
func (s *layoutStore) Delete(ctx context.Context, desc ocispec.Descriptor) error {
	return s.write(ctx, func(st *oci.Store) error { return st.Delete(ctx, desc) })
}

// Tags lists the tags in order.
func (s *layoutStore) Tags(ctx context.Context, last string, fn func([]string) error) error {
	st, err := s.read(ctx)
	if err != nil {
		return err
	}
	return st.Tags(ctx, last, fn)
}

// Predecessors returns the manifests that reference node.
func (s *layoutStore) Predecessors(ctx context.Context, node ocispec.Descriptor) ([]ocispec.Descriptor, error) {
	st, err := s.read(ctx)
	if err != nil {
		return nil, err
	}
	return st.Predecessors(ctx, node)
}
