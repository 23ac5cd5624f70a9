package e2e

import "testing"

// A re-sync of an unchanged Hub repository reads no byte of file content:
// LFS files match by their SHA-256 (the file digest of the version there,
// whose chunk lists are reused), the small non-LFS files by the git blob id
// recorded in that version, whose packs are reused. After one LFS file
// changes, a sync reads that file, nothing else, and the version pulls back
// bit for bit.
func TestSyncHubResyncReadsOnlyWhatChanged(t *testing.T) {
	files, lfs := syncModel()
	h := newSyncHub(t, files, lfs)
	syncEnv(t, h)
	reg := newDistribution(t)
	repo := reg.Host + "/team/reuse"
	var small, all int64
	for p, b := range files {
		all += int64(len(b))
		if !lfs[p] {
			small += int64(len(b))
		}
	}

	first := mustRun(t, "sync", "hf://org/model", repo+":v1").lastLine()
	if n := h.contentServed(); n < all {
		t.Fatalf("premise: the first sync reads every file: %d bytes served of %d", n, all)
	}
	again := mustRun(t, "sync", "hf://org/model", repo+":v1").lastLine()
	n := h.contentServed()
	t.Logf("unchanged re-sync: %d bytes of file content read (%d of small non-LFS files; the repository holds %d)", n, small, all)
	if again != first || n != 0 {
		t.Errorf("unchanged re-sync: %s after %s, read %d bytes; want the same version and 0 bytes", again, first, n)
	}

	changed := randBytes(777, 2<<20+321)
	h.mu.Lock()
	files["weights/b.bin"] = changed
	h.commit = "89abcdef0123456789abcdef0123456789abcdef"
	h.mu.Unlock()
	res := mustRun(t, "sync", "--json", "hf://org/model", repo+":v2")
	n = h.contentServed()
	t.Logf("re-sync with one LFS file of %d bytes changed: %d bytes read", len(changed), n)
	if want := int64(len(changed)); n != want {
		t.Errorf("re-sync with weights/b.bin changed read %d bytes, want %d (that file only)", n, want)
	}
	var out struct {
		Reference string `json:"reference"`
	}
	mustJSON(t, []byte(res.lastLine()), &out)
	syncCheckTree(t, out.Reference, files)
}
