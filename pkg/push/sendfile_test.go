package push

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// fileOpener is what pkg/oci's uploads take as a file (oci.FileOpener).
type fileOpener interface {
	OpenRange(off, n int64) (*os.File, error)
}

// fileTakingStore uploads each blob from its file when the content opens
// as one, as pkg/oci does, and counts the chunk bytes that came so and
// those read through the process.
type fileTakingStore struct {
	content.Storage
	before             func() // runs before each file is opened
	fromFile, fromRead atomic.Int64
}

func (s *fileTakingStore) Push(ctx context.Context, d ocispec.Descriptor, r io.Reader) error {
	if fo, ok := r.(fileOpener); ok && d.MediaType != ocispec.MediaTypeImageManifest {
		if s.before != nil {
			s.before()
		}
		f, err := fo.OpenRange(0, d.Size)
		if err != nil {
			return err
		}
		if f != nil {
			defer f.Close()
			s.fromFile.Add(d.Size)
			return s.Storage.Push(ctx, d, io.LimitReader(f, d.Size))
		}
	}
	if d.MediaType == layout.MediaTypeChunk {
		s.fromRead.Add(d.Size)
	}
	return s.Storage.Push(ctx, d, r)
}

// A local push hands the uploader each chunk of a large file as a run of
// that file, which the transport sends without reading it through the
// process: the chunking pass is the only one that reads those bytes.
func TestLocalChunksUploadFromFiles(t *testing.T) {
	src := t.TempDir()
	big := testutil.RandBytes(3, 5<<20+77)
	testutil.WriteTree(t, src, map[string][]byte{"big.bin": big, "small.txt": []byte("small")})
	p := layout.Params{Min: 256 << 10, Avg: 512 << 10, Max: 1 << 20}
	st := &fileTakingStore{Storage: memory.New()}
	res, err := Push(context.Background(), st, DirSource(src), Options{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	if got := st.fromFile.Load(); got != int64(len(big)) {
		t.Errorf("%d bytes of the large file uploaded from it, want all %d", got, len(big))
	}
	if got := st.fromRead.Load(); got != 5 {
		t.Errorf("%d chunk bytes read through the process, want 5 (the small file's pack, held)", got)
	}
	// The same version as a push that reads every chunk again.
	plain, err := Push(context.Background(), memory.New(), DirSource(src), Options{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	if res.Root.Digest != plain.Root.Digest {
		t.Fatalf("root %s, want %s", res.Root.Digest, plain.Root.Digest)
	}
}

// A file cut short after it was chunked fails the push with
// ErrFileChanged when its chunks are opened to upload.
func TestLocalChunkFileShrunk(t *testing.T) {
	src := t.TempDir()
	big := testutil.RandBytes(4, 3<<20)
	testutil.WriteTree(t, src, map[string][]byte{"big.bin": big})
	p := layout.Params{Min: 256 << 10, Avg: 512 << 10, Max: 1 << 20}
	path := filepath.Join(src, "big.bin")
	st := &fileTakingStore{Storage: memory.New(), before: func() { os.Truncate(path, 1000) }}
	_, err := Push(context.Background(), st, DirSource(src), Options{Params: p})
	if !errors.Is(err, ErrFileChanged) {
		t.Fatalf("push of a file cut short: %v, want ErrFileChanged", err)
	}
	if data, _ := os.ReadFile(path); !bytes.Equal(data, big[:1000]) {
		t.Fatal("the source was changed by more than the test")
	}
}

// shrinkingSource is a directory whose files are cut to 1000 bytes as they
// are opened, after the walk saw them whole.
type shrinkingSource struct {
	Source
	root string
}

func (s shrinkingSource) Open(ctx context.Context, p string) (ReadAtCloser, error) {
	f, err := s.Source.Open(ctx, p)
	if err == nil {
		if err := os.Truncate(filepath.Join(s.root, p), 1000); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, err
}

// A large file cut short after the walk, while it is read through its
// mapping (a fault past the new end), fails the push with ErrFileChanged,
// not a crash.
func TestLocalFileShrunkWhileMapped(t *testing.T) {
	src := t.TempDir()
	testutil.WriteTree(t, src, map[string][]byte{"big.bin": testutil.RandBytes(5, 40<<20)})
	p := layout.Params{Min: 256 << 10, Avg: 512 << 10, Max: 1 << 20}
	_, err := Push(context.Background(), memory.New(), shrinkingSource{DirSource(src), src}, Options{Params: p})
	if !errors.Is(err, ErrFileChanged) {
		t.Fatalf("push of a file cut short while read: %v, want ErrFileChanged", err)
	}
	if !strings.Contains(err.Error(), "cut short while read") {
		t.Errorf("error %q: want the fault on the mapping named", err)
	}
}
