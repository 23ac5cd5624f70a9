package e2e

import (
	"maps"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// partialTree is a model-shaped tree: weight files of several chunks each
// (with smallChunks), small tokenizer files packed with the other small
// files, a symlink and docs.
func partialTree() []node {
	nodes := []node{
		fileNode("weights/a.bin", 0o644, randBytes(301, 1500<<10)),
		fileNode("weights/b.bin", 0o644, randBytes(302, 1500<<10)),
		fileNode("weights/c.bin", 0o644, randBytes(303, 900<<10)),
		fileNode("tok/tokenizer.json", 0o644, randBytes(304, 5000)),
		fileNode("tok/vocab.txt", 0o644, randBytes(305, 3000)),
		fileNode("README.md", 0o644, []byte("the model\n")),
		linkNode("weights/current.bin", "a.bin"),
	}
	for i := range 30 {
		nodes = append(nodes, fileNode("docs/page"+string(rune('a'+i%26))+string(rune('a'+i/26))+".md", 0o644, randBytes(uint64(400+i), 2000)))
	}
	return nodes
}

// A partial pull through the counting registry fetches exactly the chunks
// the selected files' extents lie in (a pack whole) plus the file index,
// writes only those files and their directories, and leaves what was in
// the directory alone, a file at an unselected path of the version
// included; verify with the same selection passes, without it fails.
func TestPartialPull(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, partialTree(), time.Time{})
	name := "vols/partial"
	repo := reg.Host + "/" + name
	d := push(t, repo, repo+":v1", src, smallChunks...)
	m, idx := checkRoot(t, target{name: "distribution", reg: reg}, name, d)
	if idx == nil {
		t.Fatal("premise: a single-manifest volume")
	}
	selected := map[string]bool{"weights/a.bin": true, "tok/tokenizer.json": true}
	wantGets := map[string]int{} // blob digest: GETs a partial pull makes
	chunks := map[int64]bool{}
	var want, all int64
	for _, f := range idx.Files {
		for _, e := range f.Extents {
			if selected[f.Path] && !chunks[e[0]] {
				chunks[e[0]] = true
				want += idx.Chunks[e[0]].Size
				wantGets[idx.Chunks[e[0]].Digest] = 1
			}
		}
	}
	for _, c := range idx.Chunks {
		all += c.Size
	}
	var indexBytes int64 // the file index: one blob, or a top-level index and its pieces
	for _, l := range m.Layers {
		if l.MediaType == mtFileIndex || l.MediaType == mtTopIndex || l.MediaType == mtPiece {
			indexBytes += l.Size
			wantGets[l.Digest] = 1
		}
	}
	if len(chunks) < 3 || want > all/2 {
		t.Fatalf("premise: the selection is %d of %d chunks, %d of %d bytes", len(chunks), len(idx.Chunks), want, all)
	}

	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "README.md"), []byte("my notes\n")) // a path of the version, not selected
	mustWrite(t, filepath.Join(dir, "mine.txt"), []byte("mine\n"))
	proxy := newFaultProxy(t, reg) // counts the blob GETs by digest
	proxy.Set(faultConfig{})
	reg.Settle(t) // the push's last responses are not counted as the pull's
	reg.ResetStats()
	sel := []string{"--include", "weights/a.bin", "--include", "tok/", "--exclude", "*.txt"}
	pull(t, proxy.Host+"/"+name+":v1", dir, append([]string{"--no-cache"}, sel...)...)
	st := reg.Stats()
	if gets := proxy.blobGets(); !maps.Equal(gets, wantGets) {
		t.Errorf("blob GETs by digest %v, want %v (each selected chunk and index blob once)", gets, wantGets)
	}
	t.Logf("partial pull: %d blob bytes (%d of chunks of %d files + %d of index); the whole volume's chunks are %d bytes",
		st.BlobBytesOut, want, len(selected), indexBytes, all)
	if st.BlobBytesOut != want+indexBytes {
		t.Errorf("partial pull fetched %d blob bytes, want %d (selected chunks %d + index %d)", st.BlobBytesOut, want+indexBytes, want, indexBytes)
	}
	var names []string
	for p := range snapshot(t, dir) {
		names = append(names, p)
	}
	sort.Strings(names)
	if got, wantList := strings.Join(names, " "), "README.md mine.txt tok tok/tokenizer.json weights weights/a.bin"; got != wantList {
		t.Errorf("after the partial pull the directory holds %q, want %q", got, wantList)
	}
	for p, data := range map[string]string{"README.md": "my notes\n", "mine.txt": "mine\n"} {
		if got := fileContents(t, filepath.Join(dir, p)); string(got) != data {
			t.Errorf("%s changed to %q", p, got)
		}
	}
	for p := range selected {
		if got, want := fileContents(t, filepath.Join(dir, p)), fileContents(t, filepath.Join(src, p)); string(got) != string(want) {
			t.Errorf("%s: wrong contents", p)
		}
	}
	// README.md differs from the version, but is outside the selection.
	mustRun(t, append(append([]string{"verify"}, sel...), repo+":v1", dir)...)
	if res := run(t, "verify", repo+":v1", dir); res.code != 1 {
		t.Errorf("verify of the whole version against a partial pull: want exit 1\n%s", res)
	}
	if res := run(t, "pull", "--include", "[abc", repo+":v1", t.TempDir()); res.code != 2 || !strings.Contains(res.stderr, "[abc") {
		t.Errorf("a malformed glob: want a usage error naming it\n%s", res)
	}
}
