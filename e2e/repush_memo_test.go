package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// memoPushReport is what push --json reports, as far as these tests look.
type memoPushReport struct {
	Digest        string `json:"digest"`
	BytesUploaded int64  `json:"bytes_uploaded"`
	PiecesReused  int    `json:"pieces_reused"`
	PiecesBuilt   int    `json:"pieces_built"`
}

func memoPushJSON(t *testing.T, ref, dir string) memoPushReport {
	t.Helper()
	res := mustRun(t, "push", "--json", ref, dir)
	var r memoPushReport
	mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &r)
	return r
}

// TestRePushPieceMemo: a re-push of a dataset after a one-file change,
// against a real registry, reuses the index pieces of the version before
// (uploading under a megabyte and asking for none of its chunks), and the
// version pulls back bit for bit; the memo of a push to another
// repository is not used.
func TestRePushPieceMemo(t *testing.T) {
	const n = 20_000
	base := t.TempDir()
	src := filepath.Join(base, "src")
	writeDataset(t, src, n, datasetDirs, datasetSize)
	// Older than the stat records' margin: the re-push reads no file it
	// already knows.
	time.Sleep(2100 * time.Millisecond)
	reg := newDistribution(t)
	repo := reg.Host + "/data/memo"
	first := memoPushJSON(t, repo+":v1", src)
	if first.PiecesReused != 0 || first.PiecesBuilt < 20 {
		t.Fatalf("first push: %+v; want many pieces built, none reused", first)
	}

	changed := filepath.Join(src, "d042", "f0010042.bin")
	b, err := os.ReadFile(changed)
	if err != nil {
		t.Fatal(err)
	}
	b[7] ^= 0xff
	if err := os.WriteFile(changed, b, 0o644); err != nil {
		t.Fatal(err)
	}
	reg.ResetStats()
	second := memoPushJSON(t, repo+":v2", src)
	st := reg.Stats()
	t.Logf("re-push: %+v; registry requests %v", second, st.Requests)
	if second.BytesUploaded >= 1<<20 {
		t.Errorf("re-push after a one-file change uploaded %d bytes; want under 1 MiB", second.BytesUploaded)
	}
	if second.PiecesBuilt == 0 || second.PiecesBuilt > 2 || second.PiecesReused < first.PiecesBuilt-2 {
		t.Errorf("re-push built %d and reused %d of %d pieces; want 1 or 2 built", second.PiecesBuilt, second.PiecesReused, first.PiecesBuilt)
	}
	// The chunks of v1 are not asked for: existence checks are for the new
	// pack, the new pieces, the top-level index, config and manifests.
	if heads := st.Requests["HEAD blob"]; heads > 10 {
		t.Errorf("re-push made %d blob HEAD requests; want only those for new blobs", heads)
	}
	dst := filepath.Join(t.TempDir(), "dst")
	pull(t, repo+":v2", dst)
	compareTrees(t, src, dst)

	// Another repository: the memo is of the version in repo, not used.
	other := reg.Host + "/data/memo-other"
	o := memoPushJSON(t, other+":v2", src)
	if o.PiecesReused != 0 {
		t.Errorf("push to another repository reused %d pieces", o.PiecesReused)
	}
	if o.Digest != second.Digest {
		t.Errorf("the same tree sealed %s in another repository, %s with reused pieces", o.Digest, second.Digest)
	}
	dst2 := filepath.Join(t.TempDir(), "dst")
	pull(t, other+":v2", dst2)
	compareTrees(t, src, dst2)
	// Back to repo: the memo now is of the other repository's version.
	b[8] ^= 0xff
	if err := os.WriteFile(changed, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := memoPushJSON(t, repo+":v3", src); r.PiecesReused != 0 {
		t.Errorf("push after one to another repository reused %d pieces of its memo", r.PiecesReused)
	}
	dst3 := filepath.Join(t.TempDir(), "dst")
	pull(t, repo+":v3", dst3)
	compareTrees(t, src, dst3)
}
