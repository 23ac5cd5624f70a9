package push

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// TestDirSourceOpenRefusesSwaps: a file that became a FIFO or a symlink
// after the walk is refused at once, not read (or waited on).
func TestDirSourceOpenRefusesSwaps(t *testing.T) {
	root := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "ok"), []byte("ok"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := DirSource(root)
	for _, name := range []string{"fifo", "link"} {
		done := make(chan error, 1)
		go func() {
			f, err := src.Open(context.Background(), name)
			if err == nil {
				f.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, layout.ErrUnsupportedFile) {
				t.Errorf("open %s: %v, want ErrUnsupportedFile", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("open %s: still blocked after 10s", name)
		}
	}
	f, err := src.Open(context.Background(), "ok")
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 2)
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != "ok" {
		t.Errorf("read %q %v", b, err)
	}
	f.Close()
}

// makeSwapTrees makes root/sub/f (inside bytes) and outside/f (secret
// bytes, as long).
func makeSwapTrees(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root, outside = filepath.Join(base, "root"), filepath.Join(base, "outside")
	testutil.WriteTree(t, root, map[string][]byte{"sub/f": []byte("inside-bytes")})
	testutil.WriteTree(t, outside, map[string][]byte{"f": []byte("secret-bytes")})
	return root, outside
}

// TestDirSourceOpenRefusesSwappedDir: a directory of the tree swapped for a
// symlink to a directory outside it after the walk makes Open fail with
// ErrUnsupportedFile instead of opening the outside file, with openat2 and
// resolving stepwise alike.
func TestDirSourceOpenRefusesSwappedDir(t *testing.T) {
	defer sourceRes.Stepwise.Store(sourceRes.Stepwise.Load())
	for _, stepwise := range []bool{false, true} {
		sourceRes.Stepwise.Store(stepwise)
		root, outside := makeSwapTrees(t)
		src := DirSource(root)
		if _, err := src.Walk(context.Background()); err != nil {
			t.Fatal(err)
		}
		testutil.SwapTree(t, root, outside)
		f, err := src.Open(context.Background(), "sub/f")
		if err == nil {
			b := make([]byte, 12)
			n, _ := f.ReadAt(b, 0)
			f.Close()
			t.Fatalf("stepwise=%v: opened through the symlink, read %q", stepwise, b[:n])
		}
		if !errors.Is(err, layout.ErrUnsupportedFile) || !strings.Contains(err.Error(), filepath.Join(root, "sub", "f")) {
			t.Errorf("stepwise=%v: %v, want ErrUnsupportedFile naming the file", stepwise, err)
		}
	}
}

// swapAfterWalk is a Source whose tree changes between the walk and the reads.
type swapAfterWalk struct {
	Source
	swap func()
}

func (s swapAfterWalk) Walk(ctx context.Context) ([]Entry, error) {
	es, err := s.Source.Walk(ctx)
	s.swap()
	return es, err
}

// recordingStore keeps the bytes of every blob pushed into it.
type recordingStore struct {
	content.Storage
	mu    sync.Mutex
	blobs [][]byte
}

func (r *recordingStore) Push(ctx context.Context, d ocispec.Descriptor, rd io.Reader) error {
	b, err := io.ReadAll(rd)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.blobs = append(r.blobs, b)
	r.mu.Unlock()
	return r.Storage.Push(ctx, d, bytes.NewReader(b))
}

// TestPushRefusesSwappedDir: a push whose source directory is swapped for a
// symlink to an outside directory after the walk fails, naming the file,
// and uploads none of the outside bytes.
func TestPushRefusesSwappedDir(t *testing.T) {
	root, outside := makeSwapTrees(t)
	st := &recordingStore{Storage: memory.New()}
	src := swapAfterWalk{Source: DirSource(root), swap: func() { testutil.SwapTree(t, root, outside) }}
	_, err := Push(context.Background(), st, src, Options{})
	if !errors.Is(err, layout.ErrUnsupportedFile) || !strings.Contains(err.Error(), filepath.Join(root, "sub", "f")) {
		t.Errorf("push: %v, want ErrUnsupportedFile naming sub/f", err)
	}
	for _, b := range st.blobs {
		if bytes.Contains(b, []byte("secret-bytes")) {
			t.Errorf("a blob of %d bytes holds the outside file's bytes", len(b))
		}
	}
}
