package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// warmStatus is the mounter's warm status file, as the test reads it.
type warmStatus struct {
	Fits       bool  `json:"fits"`
	CacheBytes int64 `json:"cache_bytes"`
	CacheMax   int64 `json:"cache_max"`
	Entries    []struct {
		Ref    string `json:"ref"`
		Digest string `json:"digest"`
		State  string `json:"state"`
		Bytes  int64  `json:"bytes"`
		Cached int64  `json:"cached"`
		Error  string `json:"error"`
	} `json:"entries"`
}

// entry returns the status of ref, or the zero value.
func (s warmStatus) entry(ref string) (state, digest string) {
	for _, e := range s.Entries {
		if e.Ref == ref {
			return e.State, e.Digest
		}
	}
	return "", ""
}

// waitWarm polls the warm status until ok accepts it.
func (n *csiNode) waitWarm(what string, ok func(warmStatus) bool) warmStatus {
	n.t.Helper()
	p := filepath.Join(n.stateDir, "warm-status.json")
	deadline := time.Now().Add(90 * time.Second)
	var st warmStatus
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(p)
		if err == nil && json.Unmarshal(b, &st) == nil && ok(st) {
			return st
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(p)
	n.t.Fatalf("%s: warm status never got there:\n%s", what, b)
	return st
}

// freeAddr returns a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrape returns the samples of a Prometheus text exposition, by name with labels.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("scrape: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scrape line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// blobBytes sums the sizes of the cached blobs gets names.
func (n *csiNode) blobBytes(gets map[string]int) int64 {
	var sum int64
	for d := range gets {
		size, ok := cachedEntry(n.cacheDir, d)
		if !ok {
			n.t.Fatalf("fetched blob %s is not in the cache", d)
		}
		sum += size
	}
	return sum
}

// cachedEntry returns the size of blob d's entry in the cache under
// cacheDir, a chunk entry or a chunk folded into a backing file (its
// size is the entry's last field), and whether there is one.
func cachedEntry(cacheDir, d string) (int64, bool) {
	hex := strings.TrimPrefix(d, "sha256:")
	if fi, err := os.Stat(filepath.Join(cacheDir, "chunks", "sha256", hex)); err == nil {
		return fi.Size(), true
	}
	b, err := os.ReadFile(filepath.Join(cacheDir, "chunks", "in", hex))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return 0, false
	}
	size, err := strconv.ParseInt(f[2], 10, 64)
	return size, err == nil
}

// cachedChunks reports which chunks of the recorded version d are missing
// from the node's cache, and the bytes of the cache's entries.
func (n *csiNode) cachedChunks(d string) (missing []string, cacheBytes int64) {
	n.t.Helper()
	b, err := os.ReadFile(filepath.Join(n.cacheDir, "chunks", "versions", strings.TrimPrefix(d, "sha256:")+".json"))
	if err != nil {
		n.t.Fatalf("record of %s: %v", d, err)
	}
	var rec struct {
		Chunks []struct {
			Digest string `json:"digest"`
		} `json:"chunks"`
	}
	if err := json.Unmarshal(b, &rec); err != nil || len(rec.Chunks) == 0 {
		n.t.Fatalf("record of %s: %v (%d chunks)", d, err, len(rec.Chunks))
	}
	for _, c := range rec.Chunks {
		if _, ok := cachedEntry(n.cacheDir, c.Digest); !ok {
			missing = append(missing, c.Digest)
		}
	}
	// Chunk entries and backing files (which hold the folded chunks).
	for _, sub := range []string{"sha256", "files"} {
		es, _ := os.ReadDir(filepath.Join(n.cacheDir, "chunks", sub))
		for _, e := range es {
			if fi, err := e.Info(); err == nil {
				cacheBytes += fi.Size()
			}
		}
	}
	return missing, cacheBytes
}

// readAll reads every regular file under dir.
func readAll(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		k, err := io.Copy(io.Discard, f)
		n += k
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCSIWarmList plays a cluster that warms its nodes: a warm list of two
// versions fills the cache before any pod; a pod published afterwards reads
// its whole volume without one registry blob fetch; the list's tag moves and
// the new version is warmed with no pod asking; a list larger than the cache
// warms what fits, reports the rest and keeps every chunk of the running
// mount. The scraped metrics match the counting proxy.
func TestCSIWarmList(t *testing.T) {
	reg := newDistribution(t)
	proxy := newFaultProxy(t, reg)
	repo := proxy.Host + "/vols/warm"
	const mib = 1 << 20
	tree := func(name string, seed uint64, size int) string {
		dir := filepath.Join(t.TempDir(), name)
		buildTree(t, dir, []node{fileNode("config.json", 0o644, []byte(`{"name":"`+name+`"}`+"\n")),
			fileNode("model.safetensors", 0o644, randBytes(seed, size))}, time.Time{})
		return dir
	}
	v1, v2 := tree("v1", 101, 5*mib/4), tree("v2", 102, 5*mib/4)
	d1 := push(t, repo, repo+":prod", v1, smallChunks...)
	d2 := push(t, repo, repo+":canary", v2, smallChunks...)

	list := filepath.Join(t.TempDir(), "warm-list")
	writeList := func(lines ...string) {
		t.Helper()
		// As kubelet updates a ConfigMap volume: a new file renamed into place.
		tmp := list + ".tmp"
		if err := os.WriteFile(tmp, []byte("# warm list\n"+strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, list); err != nil {
			t.Fatal(err)
		}
	}
	prod, canary := repo+":prod", repo+":canary"
	writeList(prod, canary)
	metricsAddr := freeAddr(t)
	proxy.Set(faultConfig{})
	n := startCSIWith(t, time.Minute, "5MiB", []string{"--warm-list", list, "--warm-resolve-interval", "1s",
		"--warm-bandwidth", "64MiB", "--metrics-addr", metricsAddr, "--metrics-digests"})

	// 1. The list warms both versions, each blob fetched once.
	n.waitWarm("two versions", func(s warmStatus) bool {
		a, da := s.entry(prod)
		b, db := s.entry(canary)
		return a == "warm" && b == "warm" && da == d1 && db == d2
	})
	warmGets := proxy.blobGets()
	if len(warmGets) == 0 {
		t.Fatal("warming fetched no blob through the proxy")
	}
	for d, c := range warmGets {
		if c != 1 {
			t.Errorf("warming fetched blob %s %d times, want once", d, c)
		}
	}
	m := scrape(t, metricsAddr)
	host := proxy.Host
	blobs := fmt.Sprintf(`bdnvol_registry_fetches_total{host=%q,kind="blob"}`, host)
	blobBytes := fmt.Sprintf(`bdnvol_registry_fetched_bytes_total{host=%q,kind="blob"}`, host)
	if got, want := m[blobs], float64(len(warmGets)); got != want {
		t.Errorf("%s = %v, the proxy saw %v blob GETs", blobs, got, want)
	}
	if got, want := m[blobBytes], float64(n.blobBytes(warmGets)); got != want {
		t.Errorf("%s = %v, the blobs the proxy served hold %v bytes", blobBytes, got, want)
	}
	for _, ref := range []struct{ ref, d string }{{prod, d1}, {canary, d2}} {
		if k := fmt.Sprintf(`bdnvol_warm_state{digest=%q,ref=%q,state="warm"}`, ref.d, ref.ref); m[k] != 1 {
			t.Errorf("%s = %v, want 1", k, m[k])
		}
	}

	// 2. A pod published now reads its whole volume from the cache.
	proxy.Set(faultConfig{})
	before := scrape(t, metricsAddr)
	p := n.newPod("reader")
	start := time.Now()
	n.mustPublish(p, prod, "")
	read := readAll(t, p.target)
	warmRead := time.Since(start)
	compareTrees(t, v1, p.target)
	if gets := proxy.blobGets(); len(gets) != 0 {
		t.Errorf("a pod reading a warm version made %d registry blob fetches, want 0: %v", len(gets), gets)
	}
	after := scrape(t, metricsAddr)
	if d := after[blobs] - before[blobs]; d != 0 {
		t.Errorf("%s went up by %v while the pod read a warm version", blobs, d)
	}
	if after["bdnvol_cache_misses_total"] != before["bdnvol_cache_misses_total"] {
		t.Errorf("cache misses went from %v to %v while the pod read a warm version", before["bdnvol_cache_misses_total"], after["bdnvol_cache_misses_total"])
	}
	if d := after["bdnvol_cache_served_bytes_total"] - before["bdnvol_cache_served_bytes_total"]; d < float64(read) {
		t.Errorf("served %v bytes from the cache for a %d-byte volume", d, read)
	}
	if k := fmt.Sprintf(`bdnvol_pods{digest=%q}`, d1); after[k] != 1 {
		t.Errorf("%s = %v, want 1", k, after[k])
	}
	t.Logf("MEASURE warm version: NodePublishVolume → whole volume read (%d bytes) in %v", read, warmRead.Round(time.Microsecond))

	// 3. The tag moves: the new version is warmed without any pod asking.
	v3 := tree("v3", 103, 5*mib/4)
	proxy.Set(faultConfig{})
	d3 := push(t, repo, prod, v3, smallChunks...)
	n.waitWarm("moved tag", func(s warmStatus) bool {
		st, d := s.entry(prod)
		return st == "warm" && d == d3
	})
	if len(proxy.blobGets()) == 0 {
		t.Error("the moved tag's new version was warm without fetching anything")
	}
	m = scrape(t, metricsAddr)
	if k := fmt.Sprintf(`bdnvol_warm_state{digest=%q,ref=%q,state="warm"}`, d3, prod); m[k] != 1 {
		t.Errorf("%s = %v, want 1", k, m[k])
	}

	// 4. A list larger than the cache (5 MiB): the mounted v1 (1.25 MiB),
	// prod (v3, 1.25) and mid (2) fit; big (3) does not. Warming mid
	// evicts canary's chunks (no longer listed), never the mount's.
	mid, big := repo+":mid", repo+":big"
	dMid := push(t, repo, mid, tree("mid", 104, 2*mib), smallChunks...)
	push(t, repo, big, tree("big", 105, 3*mib), smallChunks...)
	evictedBefore := scrape(t, metricsAddr)["bdnvol_cache_evictions_total"]
	writeList(prod, big, mid)
	st := n.waitWarm("list larger than the cache", func(s warmStatus) bool {
		a, _ := s.entry(prod)
		b, _ := s.entry(big)
		c, dc := s.entry(mid)
		return a == "warm" && b == "does-not-fit" && c == "warm" && dc == dMid
	})
	if st.Fits {
		t.Error("status says the list fits")
	}
	missing, cacheBytes := n.cachedChunks(d1)
	if len(missing) > 0 {
		t.Errorf("the running mount's version lost %d chunks to warming: %v", len(missing), missing)
	}
	if cacheBytes > 5*mib {
		t.Errorf("the cache holds %d bytes, past its bound of %d", cacheBytes, 5*mib)
	}
	m = scrape(t, metricsAddr)
	if m["bdnvol_cache_evictions_total"] <= evictedBefore {
		t.Errorf("no eviction (%v): the test did not fill the cache", m["bdnvol_cache_evictions_total"])
	}
	if m["bdnvol_warm_list_fits"] != 0 {
		t.Errorf("bdnvol_warm_list_fits = %v, want 0", m["bdnvol_warm_list_fits"])
	}
	if !n.mounterLog.waitFor(10*time.Second, "warm entry does not fit") {
		t.Error("the mounter's log does not say the list does not fit")
	}
	// Still no thrash: a few more resolve rounds fetch nothing.
	proxy.Set(faultConfig{})
	time.Sleep(2500 * time.Millisecond)
	if gets := proxy.blobGets(); len(gets) != 0 {
		t.Errorf("a list that does not fit kept fetching: %d blobs in 2.5s", len(gets))
	}
	compareTrees(t, v1, p.target)
}

// TestCSIWarmVsCold measures, for one volume, the time from
// NodePublishVolume to the whole volume read through the pod's mount on a
// node that warmed it and on a cold node (empty cache), and checks that the
// warm node fetched no blob for the pod.
func TestCSIWarmVsCold(t *testing.T) {
	reg := newDistribution(t)
	proxy := newFaultProxy(t, reg)
	repo := proxy.Host + "/vols/measure"
	src := filepath.Join(t.TempDir(), "model")
	buildTree(t, src, []node{fileNode("config.json", 0o644, []byte("{}\n")),
		fileNode("model-00001.safetensors", 0o644, randBytes(201, 24<<20)),
		fileNode("model-00002.safetensors", 0o644, randBytes(202, 24<<20))}, time.Time{})
	ref := repo + ":prod"
	push(t, repo, ref, src)

	list := filepath.Join(t.TempDir(), "warm-list")
	if err := os.WriteFile(list, []byte(ref+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	warmNode := startCSIWith(t, time.Minute, "1GiB", []string{"--warm-list", list})
	warmNode.waitWarm("measure volume", func(s warmStatus) bool { st, _ := s.entry(ref); return st == "warm" })
	proxy.Set(faultConfig{})
	p := warmNode.newPod("warm")
	start := time.Now()
	warmNode.mustPublish(p, ref, "")
	size := readAll(t, p.target)
	warm := time.Since(start)
	if gets := proxy.blobGets(); len(gets) != 0 {
		t.Errorf("the pod on the warm node fetched %d blobs", len(gets))
	}
	compareTrees(t, src, p.target)

	coldNode := startCSI(t, time.Minute)
	proxy.Set(faultConfig{})
	q := coldNode.newPod("cold")
	start = time.Now()
	coldNode.mustPublish(q, ref, "")
	readAll(t, q.target)
	cold := time.Since(start)
	if gets := proxy.blobGets(); len(gets) == 0 {
		t.Error("the cold node fetched nothing")
	}
	compareTrees(t, src, q.target)
	t.Logf("MEASURE NodePublishVolume → whole volume read (%d MiB): warm node %v (%.0f MiB/s), cold node %v (%.0f MiB/s)",
		size>>20, warm.Round(time.Millisecond), float64(size)/(1<<20)/warm.Seconds(), cold.Round(time.Millisecond), float64(size)/(1<<20)/cold.Seconds())
}
