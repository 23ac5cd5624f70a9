package e2e

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// requireFUSE skips the test when FUSE mounts cannot work here, except under
// CI=true, where it fails: CI must be able to run the mount tests.
func requireFUSE(t *testing.T) {
	t.Helper()
	var why string
	if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "no /dev/fuse"
	} else if _, err3 := exec.LookPath("fusermount3"); err3 != nil && os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount"); err != nil {
			why = "neither fusermount3 nor fusermount is installed (apt-get install fuse3)"
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("FUSE is unusable under CI=true: %s", why)
	}
	t.Skipf("FUSE is unusable: %s", why)
}

// mountsEntry is one element of `bdnvol mounts --json`.
type mountsEntry struct {
	Mountpoint string `json:"mountpoint"`
	Digest     string `json:"digest"`
	Reference  string `json:"reference"`
	PID        int    `json:"pid"`
	Stale      bool   `json:"stale"`
}

func listMounts(t *testing.T) []mountsEntry {
	t.Helper()
	res := mustRun(t, "mounts", "--json")
	var ms []mountsEntry
	mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &ms)
	return ms
}

func findMount(t *testing.T, mp string) (mountsEntry, bool) {
	t.Helper()
	for _, m := range listMounts(t) {
		if m.Mountpoint == mp {
			return m, true
		}
	}
	return mountsEntry{}, false
}

// mount mounts ref with --daemon on a new directory and returns it. The
// mount is always removed in t.Cleanup, also when the test fails.
func mount(t *testing.T, ref string, flags ...string) string {
	t.Helper()
	requireFUSE(t)
	mp := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { forceUnmount(t, mp) })
	args := append([]string{"mount", "--daemon"}, flags...)
	res := mustRun(t, append(args, ref, mp)...)
	if !strings.Contains(res.lastLine(), "@sha256:") {
		t.Fatalf("mount: last line of stdout is not a pinned reference:\n%s", res)
	}
	return mp
}

// forceUnmount removes the mount at mp whatever state it is in.
func forceUnmount(t *testing.T, mp string) {
	if !mountedAt(mp) {
		return
	}
	if res := run(t, "umount", "--timeout", "10s", mp); res.code == 0 {
		return
	}
	for _, tool := range []string{"fusermount3", "fusermount"} {
		if exec.Command(tool, "-u", "-z", mp).Run() == nil {
			return
		}
	}
	detachMount(mp)
}

// mountedAt reports whether the mount table lists a FUSE mount at mp. It
// reads the table only: `bdnvol mounts` also asks every bdnvol mount on
// the machine whether it still answers, which waits on a busy one.
func mountedAt(mp string) bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && unescapeMount(f[4]) == mp && strings.Contains(line, " - fuse") {
			return true
		}
	}
	return false
}

func getxattr(t *testing.T, p, name string) string {
	t.Helper()
	buf := make([]byte, 256)
	n, err := unix.Getxattr(p, name, buf)
	if err != nil {
		t.Fatalf("getxattr %s %s: %v", p, name, err)
	}
	return string(buf[:n])
}

func TestMountTree(t *testing.T) {
	forTargets(t, func(t *testing.T, tg target) {
		src := filepath.Join(t.TempDir(), "src")
		buildTree(t, src, richTree(), time.Time{})
		repo := tg.repo("vols/mount")
		d := push(t, repo, repo+":v1", src, smallChunks...)
		if tg.reg != nil {
			tg.reg.ResetStats()
		}
		mp := mount(t, repo+":v1")
		if tg.reg != nil {
			// Listing and stat need no chunk: only manifests and the index.
			snapshotNames(t, mp)
			if st := tg.reg.Stats(); st.BlobBytesOut > 64<<10 {
				t.Errorf("mount and listing fetched %d blob bytes; want only the index", st.BlobBytesOut)
			}
		}
		compareTrees(t, src, mp) // every name, mode, symlink target and byte
		if got := getxattr(t, mp, "user.bdnvol.digest"); got != d {
			t.Errorf("user.bdnvol.digest = %q, want %q", got, d)
		}
		m, ok := findMount(t, mp)
		if !ok || m.Digest != d || m.Reference != repo+"@"+d || m.PID == 0 || m.Stale {
			t.Errorf("bdnvol mounts: %+v (found %v), want digest %s", m, ok, d)
		}
		// Read-only: every write is refused with EROFS.
		for name, err := range map[string]error{
			"create": os.WriteFile(filepath.Join(mp, "new.txt"), []byte("x"), 0o644),
			"write":  writeExisting(filepath.Join(mp, "readme.txt")),
			"mkdir":  os.Mkdir(filepath.Join(mp, "d"), 0o755),
			"remove": os.Remove(filepath.Join(mp, "readme.txt")),
			"chmod":  os.Chmod(filepath.Join(mp, "readme.txt"), 0o777),
			"rename": os.Rename(filepath.Join(mp, "readme.txt"), filepath.Join(mp, "r.txt")),
		} {
			if !errors.Is(err, syscall.EROFS) {
				t.Errorf("%s on the mount: %v, want EROFS", name, err)
			}
		}
		res := mustRun(t, "umount", mp)
		if _, ok := findMount(t, mp); ok {
			t.Fatalf("still mounted after umount:\n%s", res)
		}
		if des, err := os.ReadDir(mp); err != nil || len(des) != 0 {
			t.Errorf("mountpoint after umount: %d entries, %v", len(des), err)
		}
	})
}

func writeExisting(p string) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	f.Close()
	return nil
}

// snapshotNames lists and stats every entry under root without reading files.
func snapshotNames(t *testing.T, root string) {
	t.Helper()
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error { return err })
	if err != nil {
		t.Fatal(err)
	}
}

func TestMountReadsOneTensorLazily(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "ckpt")
	if err := synth.Generate(src, synth.Options{TargetBytes: 64 << 20, Shards: 2, Layers: 3, Seed: 7}); err != nil {
		t.Fatal(err)
	}
	const maxChunk = 1 << 20
	repo := reg.Host + "/models/lazy"
	push(t, repo, repo+":v1", src, "--chunk-min", "256KiB", "--chunk-avg", "512KiB", "--chunk-max", "1MiB")
	shards, _ := filepath.Glob(filepath.Join(src, "*.safetensors"))
	last := shards[len(shards)-1]
	shard, err := synth.ReadShard(last)
	if err != nil {
		t.Fatal(err)
	}
	// The largest tensor in the middle half of the shard.
	var tensor synth.Tensor
	for _, tt := range shard.Tensors[len(shard.Tensors)/4 : 3*len(shard.Tensors)/4] {
		if tt.Size() > tensor.Size() {
			tensor = tt
		}
	}
	if tensor.Size() < 2*maxChunk {
		t.Fatalf("test data: the tensor %s has only %d bytes", tensor.Name, tensor.Size())
	}
	var total int64
	for _, s := range shards {
		fi, _ := os.Stat(s)
		total += fi.Size()
	}

	reg.ResetStats()
	mp := mount(t, repo+":v1", "--prefetch", "none")
	f, err := os.Open(filepath.Join(mp, filepath.Base(last)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hdr := make([]byte, shard.DataStart())
	if _, err := f.ReadAt(hdr, 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // let any readahead of the header settle
	before := reg.Stats().BlobBytesOut
	if before > total/4 {
		t.Fatalf("mount and header read fetched %d of %d bytes: not lazy", before, total)
	}
	reg.ResetStats()
	start := time.Now()
	got := make([]byte, tensor.Size())
	if _, err := f.ReadAt(got, shard.DataStart()+tensor.Begin); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	want := make([]byte, tensor.Size())
	sf, err := os.Open(last)
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	if _, err := sf.ReadAt(want, shard.DataStart()+tensor.Begin); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("tensor %s read through the mount differs from the source", tensor.Name)
	}
	time.Sleep(300 * time.Millisecond) // count readahead too
	fetched := reg.Stats().BlobBytesOut
	limit := tensor.Size() + 2*maxChunk
	t.Logf("tensor %s: %d bytes read in %v, %d bytes fetched (limit %d); volume %d bytes", tensor.Name, tensor.Size(), elapsed, fetched, limit, total)
	if fetched > limit {
		t.Fatalf("reading tensor %s (%d bytes) fetched %d bytes, more than the tensor + 2 max chunks (%d)", tensor.Name, tensor.Size(), fetched, limit)
	}
}

// chunkOf returns the digest of a chunk in the middle of the file at path.
func chunkOf(t *testing.T, idx *fileIndex, path string) string {
	t.Helper()
	for _, f := range idx.Files {
		if f.Path == path && len(f.Extents) > 0 {
			return idx.Chunks[f.Extents[len(f.Extents)/2][0]].Digest
		}
	}
	t.Fatalf("%s: no such file with extents in the index", path)
	return ""
}

func TestMountCorruptChunkIsEIO(t *testing.T) {
	reg := newDistribution(t)
	tg := target{name: "distribution", reg: reg}
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, richTree(), time.Time{})
	repo := reg.Host + "/vols/corrupt"
	d := push(t, repo, repo+":v1", src, smallChunks...)
	_, idx := checkRoot(t, tg, "vols/corrupt", d)
	bad := chunkOf(t, idx, "big.bin")
	reg.Corrupt(bad)
	mp := mount(t, repo+"@"+d, "--prefetch", "none")

	_, err := os.ReadFile(filepath.Join(mp, "big.bin"))
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("reading a file with a corrupted chunk: %v, want EIO", err)
	}
	// Other files are fine.
	if got := fileContents(t, filepath.Join(mp, "readme.txt")); string(got) != "hello, volume\n" {
		t.Errorf("readme.txt = %q", got)
	}
	// The corrupt chunk was not cached: once the registry serves it right, the
	// same mount reads the file correctly.
	reg.Uncorrupt(bad)
	if got := fileContents(t, filepath.Join(mp, "big.bin")); !bytes.Equal(got, fileContents(t, filepath.Join(src, "big.bin"))) {
		t.Fatal("big.bin differs from the source after the registry recovered")
	}
}

func TestMountSharesCache(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, richTree(), time.Time{})
	repo := reg.Host + "/vols/shared"
	d := push(t, repo, repo+":v1", src, smallChunks...)
	mp1 := mount(t, repo+":v1", "--prefetch", "none")
	compareTrees(t, src, mp1)

	reg.Settle(t) // the first mount's fetches ahead may still be on the wire
	reg.ResetStats()
	mp2 := mount(t, repo+"@"+d, "--prefetch", "none")
	compareTrees(t, src, mp2)
	st := reg.Stats()
	if n := st.Requests["GET blob"]; n != 0 || st.BlobBytesOut != 0 {
		t.Fatalf("second mount of the same digest fetched %d blobs (%d bytes); want all from the shared cache", n, st.BlobBytesOut)
	}
}

func TestMountKeepsVersionWhenTagMoves(t *testing.T) {
	reg := newDistribution(t)
	v1 := filepath.Join(t.TempDir(), "v1")
	v2 := filepath.Join(t.TempDir(), "v2")
	buildTree(t, v1, []node{fileNode("weights.bin", 0o644, randBytes(1, 200<<10)), fileNode("version.txt", 0o644, []byte("one\n"))}, time.Time{})
	buildTree(t, v2, []node{fileNode("weights.bin", 0o644, randBytes(2, 200<<10)), fileNode("version.txt", 0o644, []byte("two\n")), fileNode("new.txt", 0o644, []byte("new"))}, time.Time{})
	repo := reg.Host + "/vols/moving"
	d1 := push(t, repo, repo+":prod", v1, smallChunks...)
	mp := mount(t, repo+":prod", "--prefetch", "none")
	d2 := push(t, repo, repo+":prod", v2, smallChunks...)
	if d1 == d2 {
		t.Fatal("test data: both versions have one digest")
	}
	compareTrees(t, v1, mp)
	if got := getxattr(t, mp, "user.bdnvol.digest"); got != d1 {
		t.Errorf("user.bdnvol.digest = %s after the tag moved, want %s", got, d1)
	}
	if m, _ := findMount(t, mp); m.Digest != d1 {
		t.Errorf("bdnvol mounts lists %s, want %s", m.Digest, d1)
	}
}

func TestMountAfterKill9(t *testing.T) {
	tg := target{name: "oci-layout", root: t.TempDir()}
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, richTree(), time.Time{})
	repo := tg.repo("vol")
	push(t, repo, repo+":v1", src, smallChunks...)
	mp := mount(t, repo+":v1")
	m, ok := findMount(t, mp)
	if !ok || m.PID == 0 {
		t.Fatalf("mount not listed: %+v", m)
	}
	if err := syscall.Kill(m.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var st syscall.Statfs_t
		if err := syscall.Statfs(mp, &st); errors.Is(err, syscall.ENOTCONN) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the mount did not go stale after kill -9")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if m, _ := findMount(t, mp); !m.Stale {
		t.Errorf("bdnvol mounts does not flag the killed mount as stale: %+v", m)
	}
	res := mustRun(t, "mount", "--daemon", repo+":v1", mp)
	compareTrees(t, src, mp)
	if m, _ := findMount(t, mp); m.Stale || m.PID == 0 {
		t.Errorf("after remounting: %+v\n%s", m, res)
	}
}

// flakyProxy is a reverse proxy in front of a registry that can drop every
// connection, as an unreachable registry would.
type flakyProxy struct {
	Host string
	down atomic.Bool
}

func newFlakyProxy(t *testing.T, reg *registry) *flakyProxy {
	t.Helper()
	u, _ := url.Parse(reg.URL)
	rp := httputil.NewSingleHostReverseProxy(u)
	p := &flakyProxy{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.down.Load() {
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, r)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	p.Host = l.Addr().String()
	return p
}

func TestMountRegistryDownThenBack(t *testing.T) {
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	buildTree(t, src, richTree(), time.Time{})
	push(t, reg.Host+"/vols/flaky", reg.Host+"/vols/flaky:v1", src, smallChunks...)
	proxy := newFlakyProxy(t, reg)
	mp := mount(t, proxy.Host+"/vols/flaky:v1", "--prefetch", "none", "--fetch-timeout", "2s")

	proxy.down.Store(true)
	start := time.Now()
	_, err := os.ReadFile(filepath.Join(mp, "big.bin"))
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("read with the registry down: %v, want EIO", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("EIO took %v with --fetch-timeout 2s", el)
	}
	proxy.down.Store(false)
	if got := fileContents(t, filepath.Join(mp, "big.bin")); !bytes.Equal(got, fileContents(t, filepath.Join(src, "big.bin"))) {
		t.Fatal("big.bin differs after the registry came back")
	}
}
