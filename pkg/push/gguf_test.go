package push

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

// TestGGUFFineTuneDedup pushes a generated GGUF checkpoint, then a
// fine-tune of it with a quarter of its big tensors changed, and checks
// that the second push uploads within 1.05x of the changed tensors' bytes.
// The same file under a name without .gguf (cut content-defined) is the
// comparison.
func TestGGUFFineTuneDedup(t *testing.T) {
	const n, big = 24, 3 << 20
	base := func(i int) uint64 { return uint64(100 + i) }
	changed := map[int]bool{3: true, 7: true, 11: true, 15: true, 19: true, 23: true}
	tuned := func(i int) uint64 {
		if changed[i] {
			return uint64(9000 + i)
		}
		return base(i)
	}
	v1, v2 := testutil.GGUFCheckpoint(n, big, base), testutil.GGUFCheckpoint(n, big, tuned)
	changedBytes := int64(len(changed)) * (big + 1000)
	for _, name := range []string{"model.gguf", "model.bin"} {
		ctx := context.Background()
		st := &countingStore{Storage: memory.New()}
		dir := t.TempDir()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, v1, 0o644); err != nil {
			t.Fatal(err)
		}
		first, err := Push(ctx, st, DirSource(dir), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, v2, 0o644); err != nil {
			t.Fatal(err)
		}
		st.bytes.Store(0)
		second, err := Push(ctx, st, DirSource(dir), Options{Params: first.Index.Chunking})
		if err != nil {
			t.Fatal(err)
		}
		up := st.bytes.Load()
		ratio := float64(up) / float64(changedBytes)
		t.Logf("%s: %d bytes, %d chunks; fine-tune changed %d tensor bytes, re-push uploaded %d bytes (%.3fx), dedup %.1f%%",
			name, len(v2), second.Chunks, changedBytes, up, ratio, 100*(1-float64(up)/float64(len(v2))))
		if name == "model.gguf" && ratio > 1.05 {
			t.Fatalf("GGUF fine-tune re-uploaded %d bytes, %.3fx the %d changed tensor bytes (want at most 1.05x)", up, ratio, changedBytes)
		}
	}
}
