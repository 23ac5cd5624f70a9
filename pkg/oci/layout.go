package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/internal/bounded"
)

// ErrInvalidLayout is wrapped when a file of an OCI layout (index.json,
// oci-layout, a blob) is not what the layout format allows: a symlink, a
// FIFO or device, a file of the wrong size, malformed JSON.
var ErrInvalidLayout = errors.New("invalid OCI layout")

// Limits on what is read from a layout before anything is checked.
const (
	// MaxLayoutIndexBytes bounds index.json.
	MaxLayoutIndexBytes = 16 << 20
	// MaxManifestBytes bounds a manifest, as registries do.
	MaxManifestBytes = 4 << 20
	// maxLayoutFileBytes bounds the oci-layout file.
	maxLayoutFileBytes = 4 << 10
)

// indexLockName is the lock file that serialises changes to a layout's
// index.json between processes.
const indexLockName = ".bdnvol-index.lock"

// ingestDir holds blobs being written, before they are renamed into place.
const ingestDir = "ingest"

// layoutStore is an OCI image layout that concurrent bdnvol processes can
// share and that may have been written by anyone. Nothing is read before it
// is checked: index.json is read whole only when small, descriptors are
// checked before use, blobs are opened without blocking and refused unless
// they are regular files of the size their descriptor says. Readers never
// create anything; every change to index.json happens under an exclusive
// lock on a freshly loaded index and replaces the file by a rename, so a
// reader always sees a whole index.json.
type layoutStore struct {
	root string

	mu     sync.Mutex
	cached *layoutIndex
	stamp  fileStamp // of index.json when cached was loaded
}

var _ Target = (*layoutStore)(nil)

// layoutIndex is a parsed index.json.
type layoutIndex struct {
	doc     ocispec.Index                        // as read; written back as is, apart from changes
	tags    map[string]ocispec.Descriptor        // usable tags
	bad     map[string]error                     // tags whose descriptor is unusable, and why
	digests map[digest.Digest]ocispec.Descriptor // usable manifests by digest
}

// fileStamp identifies one version of a file.
type fileStamp struct {
	dev, ino    uint64
	size, mtime int64
}

func openLayout(ctx context.Context, root string, create bool) (*layoutStore, error) {
	s := &layoutStore{root: root}
	if create {
		if err := s.ensure(ctx); err != nil {
			return nil, err
		}
	} else if err := s.checkLayoutFile(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if _, err := s.read(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Local reports that the store reads local files: an error reading one is
// not cured by reading it again.
func (s *layoutStore) Local() bool { return true }

func (s *layoutStore) path(elem ...string) string {
	return filepath.Join(append([]string{s.root}, elem...)...)
}

// ensure creates what a layout needs to be written: the directory, the
// oci-layout file, blobs/sha256 and index.json.
func (s *layoutStore) ensure(ctx context.Context) error {
	if err := os.MkdirAll(s.root, 0o755); err != nil {
		return err
	}
	fd, err := s.openDir(path.Join(ocispec.ImageBlobsDir, digest.SHA256.String()), true)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return s.write(ctx, func(x *layoutIndex) (bool, error) {
		err := s.checkLayoutFile()
		if errors.Is(err, fs.ErrNotExist) {
			b, _ := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
			err = s.replace(ocispec.ImageLayoutFile, b)
		}
		if err != nil {
			return false, err
		}
		_, err = os.Lstat(s.path(ocispec.ImageIndexFile))
		return errors.Is(err, fs.ErrNotExist), nil
	})
}

// checkLayoutFile checks the oci-layout file names a version it knows.
func (s *layoutStore) checkLayoutFile() error {
	b, _, err := s.readSmall(ocispec.ImageLayoutFile, maxLayoutFileBytes)
	if err != nil {
		return err
	}
	var l ocispec.ImageLayout
	if err := json.Unmarshal(b, &l); err != nil {
		return fmt.Errorf("%s: %s: %w: %v", s.root, ocispec.ImageLayoutFile, ErrInvalidLayout, err)
	}
	if l.Version != ocispec.ImageLayoutVersion {
		return fmt.Errorf("%s: %s: %w: imageLayoutVersion %q", s.root, ocispec.ImageLayoutFile, ErrInvalidLayout, l.Version)
	}
	return nil
}

// openRegular opens the file p for reading without blocking (a FIFO would
// block open(2) until a writer came) and refuses anything but a regular
// file; with nofollow, a symlink is refused too.
func openRegular(p string, nofollow bool) (*os.File, os.FileInfo, error) {
	flags := os.O_RDONLY | syscall.O_NONBLOCK | syscall.O_CLOEXEC
	if nofollow {
		flags |= syscall.O_NOFOLLOW
	}
	f, err := os.OpenFile(p, flags, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, nil, fmt.Errorf("%s: %w: a symlink", p, ErrInvalidLayout)
		}
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w: %s, not a regular file", p, ErrInvalidLayout, fileKind(fi.Mode()))
	}
	return f, fi, nil
}

// fileKind names the type of a file that is not a regular one.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	}
	return "type " + m.Type().String()
}

// readSmall reads the layout file name, which must be a regular file (not
// a symlink) of at most max bytes.
func (s *layoutStore) readSmall(name string, max int64) ([]byte, os.FileInfo, error) {
	f, fi, err := openRegular(s.path(name), true)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	b, err := bounded.ReadRegular(f, max)
	if errors.Is(err, bounded.ErrTooLarge) {
		return nil, nil, fmt.Errorf("%s: %w: %v", f.Name(), ErrInvalidLayout, err)
	}
	if err != nil {
		return nil, nil, err
	}
	return b, fi, nil
}
