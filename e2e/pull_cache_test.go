package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pullOut is the part of `bdnvol pull --json` these tests read.
type pullOut struct {
	Digest     string `json:"digest"`
	CacheHits  int64  `json:"cache_hits"`
	MirrorHits int64  `json:"mirror_hits"`
}

func pullJSON(t *testing.T, args ...string) pullOut {
	t.Helper()
	res := mustRun(t, append([]string{"pull", "--json"}, args...)...)
	var out pullOut
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.stdout)), &out); err != nil {
		t.Fatalf("pull --json: %v\n%s", err, res)
	}
	return out
}

// A chunk a mount fetched is not fetched again by pull: both use the shared
// chunk cache.
func TestPullReusesMountedChunks(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, richTree(), time.Time{})
	repo := reg.Host + "/vols/pullcache"
	d := push(t, repo, repo+":v1", src, smallChunks...)

	mp := mount(t, repo+":v1", "--prefetch", "none")
	compareTrees(t, src, mp) // reads every byte: every chunk is in the cache now

	reg.Settle(t) // the mount's fetches ahead may still be on the wire
	reg.ResetStats()
	out := filepath.Join(t.TempDir(), "pulled")
	res := pullJSON(t, repo+":v1", out)
	compareTrees(t, src, out)
	st := reg.Stats()
	if n := st.Requests["GET blob"]; n != 0 || st.BlobBytesOut != 0 {
		t.Fatalf("pull after a full read of the mount fetched %d blobs (%d bytes) from the registry; want 0", n, st.BlobBytesOut)
	}
	if res.Digest != d || res.CacheHits == 0 {
		t.Errorf("pull --json: %+v, want digest %s and cache hits", res, d)
	}

	// --no-cache neither reads nor fills the cache: it fetches everything.
	reg.ResetStats()
	out2 := filepath.Join(t.TempDir(), "pulled")
	if res := pullJSON(t, "--no-cache", repo+"@"+d, out2); res.CacheHits != 0 {
		t.Errorf("pull --no-cache reported %d cache hits", res.CacheHits)
	}
	compareTrees(t, src, out2)
	if n := reg.Stats().Requests["GET blob"]; n == 0 {
		t.Error("pull --no-cache fetched no blob from the registry")
	}
}

// By default pull adds nothing to the cache; with --cache it fills it, so a
// later mount fetches nothing.
func TestPullCacheFlag(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, richTree(), time.Time{})
	repo := reg.Host + "/vols/pullfill"
	push(t, repo, repo+":v1", src, smallChunks...)

	pullJSON(t, repo+":v1", filepath.Join(t.TempDir(), "a"))
	reg.ResetStats()
	pullJSON(t, repo+":v1", filepath.Join(t.TempDir(), "b"))
	if n := reg.Stats().Requests["GET blob"]; n == 0 {
		t.Fatal("a default pull filled the chunk cache; it should only read it")
	}

	pullJSON(t, "--cache", repo+":v1", filepath.Join(t.TempDir(), "c"))
	reg.ResetStats()
	mp := mount(t, repo+":v1", "--prefetch", "none")
	compareTrees(t, src, mp)
	st := reg.Stats()
	if n := st.Requests["GET blob"]; n != 0 || st.BlobBytesOut != 0 {
		t.Fatalf("mount after pull --cache fetched %d blobs (%d bytes); want all from the cache", n, st.BlobBytesOut)
	}
}
