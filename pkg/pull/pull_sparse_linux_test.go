package pull

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/opencontainers/go-digest"
)

// readBytes returns the bytes this process has read so far (rchar of
// /proc/self/io: every read(2) and pread(2), whatever the file).
func readBytes(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/io")
	if err != nil {
		t.Skipf("no read counter: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "rchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Skip("no rchar in /proc/self/io")
	return 0
}

// plantSparse makes p a sparse file of size bytes holding nothing, or
// skips the test where the file system cannot report holes.
func plantSparse(t *testing.T, p string, size int64) {
	t.Helper()
	fh, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := fh.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if !holeIn(fh, 0, size) {
		t.Skip("the file system reports no holes")
	}
}

// TestMatchingFileSparse: a sparse file of the declared size at a file's
// final name is not trusted as matching and is not read (hashing it would
// read 16 GiB of holes); a plain file with the right bytes still matches.
func TestMatchingFileSparse(t *testing.T) {
	dst := t.TempDir()
	const size = 16 << 30
	plantSparse(t, filepath.Join(dst, "big"), size)
	ok := testutil.RandBytes(1, 1<<20)
	testutil.WriteTree(t, dst, map[string][]byte{"ok": ok})
	d, err := openDest(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close(true)
	before := readBytes(t)
	fh, _, err := d.matchingFile(d.root, &layout.File{Path: "big", Type: layout.TypeFile, Mode: 0o644, Size: size, Digest: digest.FromString("big")}, nil, nil)
	if err != nil || fh != nil {
		t.Errorf("sparse file: %v %v, want no match", fh, err)
	}
	if n := readBytes(t) - before; n > 1<<20 {
		t.Errorf("read %d bytes to look at a sparse file of %d", n, int64(size))
	}
	fh, _, err = d.matchingFile(d.root, &layout.File{Path: "ok", Type: layout.TypeFile, Mode: 0o644, Size: int64(len(ok)), Digest: digest.FromBytes(ok)}, nil, nil)
	if err != nil || fh == nil {
		t.Fatalf("plain matching file: %v %v, want a match", fh, err)
	}
	fh.Close()
}

// TestPullOverSparseFile: a 16 GiB sparse file planted at the final name of
// a 4 MiB file is neither hashed, cut into chunks nor read for chunks at the
// same offsets: the pull reads little and writes the right bytes.
func TestPullOverSparseFile(t *testing.T) {
	files := map[string][]byte{"w": testutil.RandBytes(1, 4<<20), "s": []byte("small")}
	store, v := pushed(t, layout.Params{Min: 64 << 10, Avg: 256 << 10, Max: 1 << 20}, files)
	dst := t.TempDir()
	plantSparse(t, filepath.Join(dst, "w"), 16<<30)
	before := readBytes(t)
	if _, err := Materialise(context.Background(), store, v, dst, Options{Jobs: 2}); err != nil {
		t.Fatal(err)
	}
	if n := readBytes(t) - before; n > 64<<20 {
		t.Errorf("the pull read %d bytes (a 4 MiB file over a 16 GiB sparse one)", n)
	}
	checkPulled(t, dst, files, nil)
}
