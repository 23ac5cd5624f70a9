package e2e

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// mirrorFixture pushes one version to a primary registry and, with the same
// chunking (so the same digests), to a second registry acting as a mirror
// that holds every chunk.
type mirrorFixture struct {
	primary, mirror *registry
	src, repo, d    string
	chunks          []string
}

func newMirrorFixture(t *testing.T, name string) *mirrorFixture {
	t.Helper()
	fx := &mirrorFixture{primary: newDistribution(t), mirror: newDistribution(t)}
	fx.src = filepath.Join(t.TempDir(), "src")
	buildTree(t, fx.src, richTree(), time.Time{})
	fx.repo = fx.primary.Host + "/" + name
	fx.d = push(t, fx.repo, fx.repo+":v1", fx.src, smallChunks...)
	if md := push(t, fx.mirror.Host+"/"+name, fx.mirror.Host+"/"+name+":v1", fx.src, smallChunks...); md != fx.d {
		t.Fatalf("the mirror copy has digest %s, the primary %s", md, fx.d)
	}
	_, idx := checkRoot(t, target{name: "distribution", reg: fx.primary}, name, fx.d)
	if idx == nil || len(idx.Chunks) == 0 {
		t.Fatal("test data: no chunks in the index")
	}
	for _, c := range idx.Chunks {
		fx.chunks = append(fx.chunks, c.Digest)
	}
	fx.primary.ResetStats()
	fx.mirror.ResetStats()
	return fx
}

func TestMountMirrorServesChunks(t *testing.T) {
	fx := newMirrorFixture(t, "vols/mirrored")
	mp := mount(t, fx.repo+":v1", "--prefetch", "none", "--mirror", fx.mirror.URL)
	compareTrees(t, fx.src, mp)
	if st := fx.primary.Stats(); st.Requests["GET blob"] != 0 || st.BlobBytesOut != 0 {
		t.Errorf("the primary served %d blob GETs (%d bytes); the mirror holds every chunk", st.Requests["GET blob"], st.BlobBytesOut)
	}
	if n := fx.mirror.Stats().Requests["GET blob"]; n < len(fx.chunks) {
		t.Errorf("the mirror served %d blob GETs, want at least the %d chunks", n, len(fx.chunks))
	}

	// pull takes the same mirrors (with its own, empty, cache).
	fx.primary.ResetStats()
	out := filepath.Join(t.TempDir(), "pulled")
	res := pullJSON(t, "--no-cache", "--mirror", fx.mirror.URL, fx.repo+":v1", out)
	compareTrees(t, fx.src, out)
	if n := fx.primary.Stats().Requests["GET blob"]; n != 0 || res.MirrorHits == 0 {
		t.Errorf("pull --mirror: the primary served %d blob GETs, %d mirror hits", n, res.MirrorHits)
	}
}

func TestMountMirrorCorruptFallsBack(t *testing.T) {
	fx := newMirrorFixture(t, "vols/badmirror")
	for _, c := range fx.chunks {
		fx.mirror.Corrupt(c)
	}
	mp := mount(t, fx.repo+":v1", "--prefetch", "none", "--mirror", fx.mirror.URL)
	compareTrees(t, fx.src, mp) // every byte right
	if n := fx.mirror.Stats().Requests["GET blob"]; n == 0 {
		t.Error("the mirror was never asked")
	}
	if n := fx.primary.Stats().Requests["GET blob"]; n < len(fx.chunks) {
		t.Errorf("the primary served %d blob GETs, want every one of the %d chunks the mirror corrupted", n, len(fx.chunks))
	}
	// Nothing corrupt was cached: a second mount of the digest, mirror still
	// bad, reads the right bytes from the cache alone.
	fx.primary.ResetStats()
	mp2 := mount(t, fx.repo+"@"+fx.d, "--prefetch", "none", "--mirror", fx.mirror.URL)
	compareTrees(t, fx.src, mp2)
	if n := fx.primary.Stats().Requests["GET blob"]; n != 0 {
		t.Errorf("second mount fetched %d blobs; the verified chunks should be cached", n)
	}
}

func TestMountMirrorDownFallsBack(t *testing.T) {
	fx := newMirrorFixture(t, "vols/downmirror")
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String()
	l.Close()
	mp := mount(t, fx.repo+":v1", "--prefetch", "none", "--mirror", down)
	start := time.Now()
	compareTrees(t, fx.src, mp)
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("reading through a down mirror took %v", el)
	}
	if n := fx.primary.Stats().Requests["GET blob"]; n < len(fx.chunks) {
		t.Errorf("the primary served %d blob GETs, want the %d chunks", n, len(fx.chunks))
	}
}

// A containerd hosts.toml for the primary's host names the mirror.
func TestMountHostsDir(t *testing.T) {
	fx := newMirrorFixture(t, "vols/hosts")
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, fx.primary.Host), 0o755); err != nil {
		t.Fatal(err)
	}
	toml := strings.Join([]string{
		`server = "http://` + fx.primary.Host + `"`,
		``,
		`[host."http://127.0.0.1:1"]   # push only: never read from`,
		`  capabilities = ["push"]`,
		``,
		`[host."` + fx.mirror.URL + `"]`,
		`  capabilities = ["pull", "resolve"]`,
	}, "\n")
	if err := os.WriteFile(filepath.Join(dir, fx.primary.Host, "hosts.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	mp := mount(t, fx.repo+":v1", "--prefetch", "none", "--hosts-dir", dir)
	f, err := os.ReadFile(filepath.Join(mp, "big.bin"))
	if err != nil || !bytes.Equal(f, fileContents(t, filepath.Join(fx.src, "big.bin"))) {
		t.Fatalf("big.bin through the mount: %v", err)
	}
	compareTrees(t, fx.src, mp)
	if n := fx.primary.Stats().Requests["GET blob"]; n != 0 {
		t.Errorf("the primary served %d blob GETs; hosts.toml names a mirror holding every chunk", n)
	}
	if n := fx.mirror.Stats().Requests["GET blob"]; n == 0 {
		t.Error("the mirror named in hosts.toml was never asked")
	}
}
