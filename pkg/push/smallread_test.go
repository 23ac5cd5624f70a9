package push

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// openCounter is a source that counts the opens of each file and the most
// files open at once.
type openCounter struct {
	Source
	mu          sync.Mutex
	opens       map[string]int
	open, most  int
	holdForOpen time.Duration
}

func (s *openCounter) Open(ctx context.Context, p string) (ReadAtCloser, error) {
	s.mu.Lock()
	s.opens[p]++
	s.open++
	s.most = max(s.most, s.open)
	s.mu.Unlock()
	time.Sleep(s.holdForOpen) // lets reads overlap
	f, err := s.Source.Open(ctx, p)
	if err != nil {
		return nil, err
	}
	return &countedFile{f, s}, nil
}

type countedFile struct {
	ReadAtCloser
	s *openCounter
}

func (f *countedFile) Close() error {
	f.s.mu.Lock()
	f.s.open--
	f.s.mu.Unlock()
	return f.ReadAtCloser.Close()
}

// TestPushSmallFilesParallelBounded: a push reads small files several at
// a time but never more than smallReaders open, each file once (the packs
// it uploads are the bytes it read), and seals what a second push of the
// same tree seals.
func TestPushSmallFilesParallelBounded(t *testing.T) {
	files := map[string][]byte{}
	for i := range 300 {
		files[fmt.Sprintf("d%d/f%03d", i%7, i)] = testutil.RandBytes(uint64(i), 100+i)
	}
	dir := t.TempDir()
	testutil.WriteVolumeTree(t, dir, files)
	p := layout.Params{Min: 16 << 10, Avg: 64 << 10, Max: 256 << 10, Pack: 4 << 10}
	src := &openCounter{Source: DirSource(dir), opens: map[string]int{}, holdForOpen: time.Millisecond}
	res, err := Push(context.Background(), memory.New(), src, Options{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	if src.most < 2 || src.most > smallReaders {
		t.Errorf("at most %d files open at once; want 2 to %d", src.most, smallReaders)
	}
	for name := range files {
		if src.opens[name] != 1 {
			t.Errorf("%s opened %d times, want once", name, src.opens[name])
		}
	}
	again, err := Push(context.Background(), memory.New(), DirSource(dir), Options{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	if again.Root.Digest != res.Root.Digest || res.Chunks < 5 {
		t.Errorf("pushes sealed %s and %s (%d chunks)", res.Root.Digest, again.Root.Digest, res.Chunks)
	}
}
