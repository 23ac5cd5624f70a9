package pull

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func TestCloneHead(t *testing.T) {
	for _, c := range []struct {
		dst, src, n, want int64
	}{
		{0, 0, 1 << 20, 0},                    // aligned already
		{100, 100, 1 << 20, cloneBlock - 100}, // same place in a block
		{100, 200, 1 << 20, 0},                // different places: no block can be cloned
		{100, 100 + 3*cloneBlock, 1 << 20, cloneBlock - 100},
		{100, 100, cloneBlock, 0}, // no whole block after the head
		{100, 100, 2*cloneBlock - 100, cloneBlock - 100},
	} {
		if got := cloneHead(c.dst, c.src, c.n); got != c.want {
			t.Errorf("cloneHead(%d, %d, %d) = %d, want %d", c.dst, c.src, c.n, got, c.want)
		}
	}
}

// TestCopyLockedOffsets copies ranges at aligned, congruent and unrelated
// offsets, in and across copy steps, and checks every byte lands where it
// should and nothing else changes.
func TestCopyLockedOffsets(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 3*copyStep+5*cloneBlock)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	srcPath := filepath.Join(dir, "src")
	if err := os.WriteFile(srcPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(srcPath)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for _, c := range []struct {
		name              string
		dstOff, srcOff, n int64
	}{
		{"aligned", 0, 0, 2*copyStep + 3*cloneBlock},
		{"congruent", 100, 100, 2*copyStep + 17},
		{"congruent, shifted by blocks", 777, 777 + 2*cloneBlock, copyStep + 5},
		{"unrelated", 100, 4000, copyStep + 999},
		{"short", 4090, 4090, 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			size := c.dstOff + c.n + 1000
			want := bytes.Repeat([]byte{0xee}, int(size))
			dstPath := filepath.Join(dir, "dst")
			if err := os.WriteFile(dstPath, want, 0o600); err != nil {
				t.Fatal(err)
			}
			dst, err := os.OpenFile(dstPath, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()
			if err := copyLocked(&sync.Mutex{}, dst, c.dstOff, src, c.srcOff, c.n); err != nil {
				t.Fatal(err)
			}
			copy(want[c.dstOff:], data[c.srcOff:c.srcOff+c.n])
			got, err := os.ReadFile(dstPath)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				i := 0
				for i < len(got) && i < len(want) && got[i] == want[i] {
					i++
				}
				t.Fatalf("destination differs from byte %d (of %d, want %d)", i, len(got), len(want))
			}
		})
	}
}
