package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// cacheLs runs `bdnvol cache ls --json` in the test's cache.
func cacheLs(t *testing.T) []struct {
	Pinned   string `json:"pinned"`
	Cached   int64  `json:"cached"`
	Total    int64  `json:"total"`
	Complete bool   `json:"complete"`
	InUse    bool   `json:"in_use"`
} {
	t.Helper()
	res := mustRun(t, "cache", "ls", "--json")
	var out []struct {
		Pinned   string `json:"pinned"`
		Cached   int64  `json:"cached"`
		Total    int64  `json:"total"`
		Complete bool   `json:"complete"`
		InUse    bool   `json:"in_use"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &out); err != nil {
		t.Fatalf("cache ls --json: %v\n%s", err, res)
	}
	return out
}

// TestCacheWarmCLI covers `bdnvol cache warm/ls/rm/gc`: a warm cut short by
// a registry outage fails and is resumed by a second run that fetches only
// what is missing; ls tells complete from not; a version larger than the
// cache is refused before anything is fetched; a glob warms only its files;
// rm and gc drop what no mount uses.
func TestCacheWarmCLI(t *testing.T) {
	reg := newDistribution(t)
	proxy := newFaultProxy(t, reg)
	repo := proxy.Host + "/vols/cachecli"
	src := filepath.Join(t.TempDir(), "v1")
	buildTree(t, src, []node{fileNode("config.json", 0o644, []byte("{}\n")),
		fileNode("a.safetensors", 0o644, randBytes(7, 900<<10)), fileNode("b.bin", 0o644, randBytes(8, 700<<10))}, time.Time{})
	d := push(t, repo, repo+":v1", src, smallChunks...)
	pinned := repo + "@" + d

	// An outage part way: the warm fails, naming the version, and is incomplete.
	proxy.Set(faultConfig{DownAfter: 12})
	res := run(t, "cache", "warm", "--jobs", "1", repo+":v1")
	if res.code == 0 {
		t.Fatalf("a warm cut by an outage exited 0:\n%s", res)
	}
	cachedBefore := cachedBlobs(t)
	ls := cacheLs(t)
	if len(ls) != 0 && ls[0].Complete {
		t.Fatalf("cache ls after a failed warm: %+v, want incomplete", ls)
	}
	// The second run resumes: no blob the first run got is fetched again.
	proxy.Set(faultConfig{})
	res = mustRun(t, "cache", "warm", repo+":v1")
	if !strings.Contains(res.stdout, pinned) {
		t.Errorf("cache warm does not name %s:\n%s", pinned, res)
	}
	again := proxy.blobGets()
	if len(cachedBefore) == 0 || len(again) == 0 {
		t.Fatalf("the outage left %d blobs cached and the second run fetched %d: the test cut nothing", len(cachedBefore), len(again))
	}
	for dg := range again {
		if cachedBefore[dg] {
			t.Errorf("blob %s cached by the first run was fetched again", dg)
		}
	}
	ls = cacheLs(t)
	if len(ls) != 1 || ls[0].Pinned != pinned || !ls[0].Complete || ls[0].Cached != ls[0].Total || ls[0].InUse {
		t.Fatalf("cache ls after a complete warm: %+v", ls)
	}
	// A third run fetches nothing.
	proxy.Set(faultConfig{})
	mustRun(t, "cache", "warm", pinned)
	if gets := proxy.blobGets(); len(gets) != 0 {
		t.Errorf("warming a warm version fetched %d blobs", len(gets))
	}

	// rm drops it; ls no longer lists it.
	res = mustRun(t, "cache", "rm", pinned)
	if !strings.Contains(res.stdout, "removed") {
		t.Errorf("cache rm: %s", res)
	}
	if ls := cacheLs(t); len(ls) != 0 {
		t.Errorf("cache ls after rm: %+v", ls)
	}
	if res := run(t, "cache", "rm", pinned); res.code == 0 || !strings.Contains(res.stderr, d) {
		t.Errorf("rm of a version not in the cache: want a failure naming it:\n%s", res)
	}

	// Too large for the cache: refused before fetching anything.
	proxy.Set(faultConfig{})
	res = run(t, "cache", "warm", "--cache-size", "512KiB", pinned)
	if res.code == 0 || !strings.Contains(res.stderr, "does not fit") {
		t.Fatalf("warming 1.6 MiB into 512 KiB: want a failure saying it does not fit:\n%s", res)
	}
	if gets := proxy.blobGets(); len(gets) > 1 { // at most the index, to learn the size
		t.Errorf("a warm that does not fit fetched %d blobs", len(gets))
	}

	// A glob warms only its files: complete for the glob, less than the version.
	mustRun(t, "cache", "warm", "--prefetch", "*.safetensors", pinned)
	ls = cacheLs(t)
	if len(ls) != 1 || !ls[0].Complete || ls[0].Total >= 1600<<10 || ls[0].Total < 900<<10 {
		t.Fatalf("cache ls after warming *.safetensors: %+v", ls)
	}
	res = mustRun(t, "cache", "gc")
	if !strings.Contains(res.stdout, "removed 1 version") {
		t.Errorf("cache gc: %s", res)
	}
	if ls := cacheLs(t); len(ls) != 0 {
		t.Errorf("cache ls after gc: %+v", ls)
	}
}

// cachedBlobs lists the digests in the test's chunk cache.
func cachedBlobs(t *testing.T) map[string]bool {
	t.Helper()
	es, _ := os.ReadDir(filepath.Join(home(t), "bdnvol", "chunks", "sha256"))
	out := map[string]bool{}
	for _, e := range es {
		out["sha256:"+e.Name()] = true
	}
	return out
}

// TestCacheRecordsWithMalformedDigests: version records in the cache
// directory are input. A record naming a chunk "sha256:../../../victim", or
// a root digest of that form, must not make `cache gc` or `cache rm` delete
// a file outside the cache: both skip the record with a warning, and remove
// the well-formed records as usual.
func TestCacheRecordsWithMalformedDigests(t *testing.T) {
	lay := "oci:" + filepath.Join(t.TempDir(), "vols")
	src := filepath.Join(t.TempDir(), "v1")
	buildTree(t, src, []node{fileNode("config.json", 0o644, []byte("{}\n")), fileNode("a.bin", 0o644, randBytes(9, 300<<10))}, time.Time{})
	mustRun(t, "push", lay+":v1", src)
	mustRun(t, "cache", "warm", lay+":v1")

	h := home(t)
	versions := filepath.Join(h, "bdnvol", "chunks", "versions") // the chunks are in ../sha256
	victims := []string{filepath.Join(h, "victim"), filepath.Join(h, "victim2.json")}
	for _, v := range victims {
		if err := os.WriteFile(v, []byte("not the cache's\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hex1, hex2 := strings.Repeat("1", 64), strings.Repeat("2", 64)
	for name, body := range map[string]string{
		hex1: `{"ref":"planted","pinned":"planted","root":{"digest":"sha256:` + hex1 + `","size":2},"chunks":[{"digest":"sha256:../../../victim","size":16}]}`,
		hex2: `{"ref":"planted2","pinned":"planted2","root":{"digest":"sha256:../../../victim2","size":2},"chunks":[]}`,
	} {
		if err := os.WriteFile(filepath.Join(versions, name+".json"), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what string, res result) {
		t.Helper()
		for _, v := range victims {
			if _, err := os.Stat(v); err != nil {
				t.Fatalf("%s deleted %s outside the cache (%v):\n%s", what, v, err, res)
			}
		}
		if strings.Count(res.stderr, "warning: skipped") != 2 || !strings.Contains(res.stderr, "../../../victim") {
			t.Errorf("%s: want a warning for each of the 2 malformed records:\n%s", what, res)
		}
	}
	res := run(t, "cache", "rm", "planted")
	if res.code == 0 {
		t.Errorf("rm of a malformed record's ref succeeded:\n%s", res)
	}
	check("cache rm", res)
	res = mustRun(t, "cache", "gc")
	check("cache gc", res)
	if !strings.Contains(res.stdout, "removed 1 version") {
		t.Errorf("cache gc: want the warmed version removed:\n%s", res)
	}
}
