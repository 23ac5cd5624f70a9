package e2e

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// Delta chunks (issue 43): a version whose tensors all moved a little
// is stored as deltas against the version before; every reader decodes
// them and verifies the plain bytes.

// deltaPush is the --json of a push with deltas.
type deltaPush struct {
	Digest          string  `json:"digest"`
	Bytes           int64   `json:"bytes"`
	BytesUploaded   int64   `json:"bytes_uploaded"`
	BytesAsChunks   int64   `json:"bytes_as_chunks"`
	BytesAsDeltas   int64   `json:"bytes_as_deltas"`
	DeltaChunks     int     `json:"delta_chunks"`
	DeltaChunkBytes int64   `json:"delta_chunk_bytes"`
	DeltaRatio      float64 `json:"delta_ratio"`

	BaseBytesLocal   int64 `json:"base_bytes_local"`
	BaseBytesFetched int64 `json:"base_bytes_fetched"`
}

func pushDelta(t testing.TB, ref, dir string, flags ...string) deltaPush {
	t.Helper()
	args := append([]string{"push", "--json"}, flags...)
	res := mustRun(t, append(args, ref, dir)...)
	var p deltaPush
	mustJSON(t, []byte(strings.TrimSpace(res.stdout)), &p)
	return p
}

// rlStep writes a checkpoint of about size bytes to v1 and the same after
// an RL-like step (2 % of the bf16 elements moved a little) to v2.
func rlStep(t testing.TB, size int64) (v1, v2 string) {
	t.Helper()
	v1, v2 = filepath.Join(t.TempDir(), "v1"), filepath.Join(t.TempDir(), "v2")
	if err := synth.Generate(v1, synth.Options{TargetBytes: size, Shards: 2, Seed: 43}); err != nil {
		t.Fatal(err)
	}
	if _, err := synth.Perturb(v1, v2, synth.PerturbOptions{Fraction: 0.02, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	return v1, v2
}

// manifestLayers returns the layers of a single-manifest version.
func manifestLayers(t testing.TB, reg *registry, name, digest string) []ociDescriptor {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, reg.URL+"/v2/"+name+"/manifests/"+digest, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m struct {
		Layers []ociDescriptor `json:"layers"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("manifest %s: %v\n%s", digest, err, b)
	}
	return m.Layers
}

type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

func TestDeltaRoundTrip(t *testing.T) {
	reg := newDistribution(t)
	name := "vols/rl"
	repo := reg.Host + "/" + name
	v1, v2 := rlStep(t, 24<<20)
	pushDelta(t, repo+":v1", v1)
	p := pushDelta(t, repo+":v2", v2)
	if p.DeltaChunks == 0 || p.BytesAsDeltas == 0 {
		t.Fatalf("no chunk stored as a delta: %+v", p)
	}
	if r := float64(p.BytesUploaded) / float64(p.Bytes); r > 0.1 {
		t.Errorf("RL step uploaded %d of %d bytes (%.3f), want at most 0.1", p.BytesUploaded, p.Bytes, r)
	}
	// A re-push of the same tree (another tag) is the same version, and
	// uploads nothing: its delta chunks stay deltas.
	again := pushDelta(t, repo+":again", v2)
	if again.Digest != p.Digest || again.BytesUploaded > p.Bytes/100 {
		t.Errorf("re-push of the RL step: %s uploading %d bytes, want %s uploading nothing", again.Digest, again.BytesUploaded, p.Digest)
	}
	off := pushDelta(t, reg.Host+"/vols/plain:v2", v2, "--delta", "off")
	if off.DeltaChunks != 0 || off.BytesUploaded < off.Bytes {
		t.Errorf("--delta off: %+v", off)
	}
	ref := repo + "@" + p.Digest

	// Cold pull: deltas and their bases, decoded and verified.
	reg.ResetStats()
	cold := filepath.Join(t.TempDir(), "cold")
	pull(t, ref, cold)
	compareTrees(t, v2, cold)
	if got := reg.Stats().BlobBytesOut; float64(got) > 1.05*float64(p.Bytes) {
		t.Errorf("cold pull fetched %d bytes for a version of %d", got, p.Bytes)
	}
	mustRun(t, "verify", ref, cold)

	// Upgrade in place: the bases are in the directory, only the deltas
	// are fetched.
	up := filepath.Join(t.TempDir(), "up")
	pull(t, repo+":v1", up)
	reg.ResetStats()
	pull(t, ref, up)
	compareTrees(t, v2, up)
	if got := reg.Stats().BlobBytesOut; float64(got) > 1.05*float64(p.BytesUploaded) {
		t.Errorf("upgrade fetched %d bytes, the push uploaded %d", got, p.BytesUploaded)
	}

	// A base in the directory that was changed since is not used: the
	// base is fetched, and the result is still the version.
	lying := filepath.Join(t.TempDir(), "lying")
	pull(t, repo+":v1", lying)
	shard := filepath.Join(lying, "model-00001-of-00002.safetensors")
	b := fileContents(t, shard)
	for i := len(b) / 4; i < len(b); i += len(b) / 4 {
		b[i] ^= 0xff
	}
	mustWrite(t, shard, b)
	pull(t, ref, lying)
	compareTrees(t, v2, lying)

	// inspect names the deltas and their bases, and format 4 (the sparse
	// delta encoding).
	var ins struct {
		FormatVersion int `json:"format_version"`
		Deltas        []struct {
			Chunk, Digest, Base string
		} `json:"deltas"`
	}
	mustJSON(t, []byte(mustRun(t, "inspect", "--json", ref).stdout), &ins)
	if ins.FormatVersion != 4 || len(ins.Deltas) != p.DeltaChunks || ins.Deltas[0].Base == "" {
		t.Errorf("inspect --json: format %d, %d deltas (want %d)", ins.FormatVersion, len(ins.Deltas), p.DeltaChunks)
	}
	if out := mustRun(t, "inspect", ref).stdout; !strings.Contains(out, "deltas:") || !strings.Contains(out, "base sha256:") {
		t.Errorf("inspect does not show the deltas:\n%s", out)
	}
	// The views hold plain bytes: their builders verify every file.
	mustRun(t, "export-image", ref)
	mustRun(t, "export-modelpack", ref)

	// copy takes the delta blobs and the bases as they are.
	dst := newDistribution(t)
	mustRun(t, "copy", repo+":v2", dst.Host+"/copied")
	copied := filepath.Join(t.TempDir(), "copied")
	pull(t, dst.Host+"/copied:v2", copied, "--no-cache")
	compareTrees(t, v2, copied)

	// Mount: a read decodes the chunk; with the version before read
	// through a mount on this node, its chunks are in the cache and only
	// the deltas are fetched.
	shards := []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
	mp1 := mount(t, repo+":v1", "--prefetch", "none")
	for _, f := range shards {
		fileContents(t, filepath.Join(mp1, f))
	}
	reg.Settle(t)
	reg.ResetStats()
	mp := mount(t, ref, "--prefetch", "none")
	for _, f := range shards {
		if got, want := fileContents(t, filepath.Join(mp, f)), fileContents(t, filepath.Join(v2, f)); string(got) != string(want) {
			t.Fatalf("%s through the mount differs from the source", f)
		}
	}
	reg.Settle(t)
	if got := reg.Stats().BlobBytesOut; float64(got) > 1.05*float64(p.BytesUploaded) {
		t.Errorf("a mount over a cache holding v1 fetched %d bytes, the push uploaded %d", got, p.BytesUploaded)
	}
}

// TestDeltaHostileRegistry: a registry that serves a wrong base or a wrong
// delta gets the pull refused with nothing written, and a mount's read EIO.
func TestDeltaHostileRegistry(t *testing.T) {
	reg := newDistribution(t)
	name := "vols/rlbad"
	repo := reg.Host + "/" + name
	v1, v2 := rlStep(t, 12<<20)
	pushDelta(t, repo+":v1", v1)
	p := pushDelta(t, repo+":v2", v2)
	if p.DeltaChunks == 0 {
		t.Fatalf("no delta: %+v", p)
	}
	var delta, base string
	for _, l := range manifestLayers(t, reg, name, p.Digest) {
		if l.MediaType == "application/vnd.bdnvol.chunk.delta.v1" && delta == "" {
			delta = l.Digest
		}
	}
	v1layers := map[string]bool{}
	for _, l := range manifestLayers(t, reg, name, pushDelta(t, repo+":v1", v1).Digest) {
		v1layers[l.Digest] = true
	}
	// The bases that are not chunks of v2 come last.
	if ls := manifestLayers(t, reg, name, p.Digest); len(ls) > 0 {
		if l := ls[len(ls)-1]; l.MediaType == "application/vnd.bdnvol.chunk.v1" && v1layers[l.Digest] {
			base = l.Digest
		}
	}
	if delta == "" || base == "" {
		t.Fatalf("no delta layer (%q) or base layer (%q) in the manifest", delta, base)
	}
	ref := repo + "@" + p.Digest
	for _, bad := range []string{base, delta} {
		reg.Corrupt(bad)
		dir := filepath.Join(t.TempDir(), "dst")
		res := run(t, "pull", "--no-cache", ref, dir)
		if res.code == 0 || !strings.Contains(res.stderr, "does not match") {
			t.Fatalf("pull with %s corrupted:\n%s", bad, res)
		}
		// The file the bad chunk is for is not written.
		m := regexp.MustCompile(`\(for ([^)]+)\)`).FindStringSubmatch(res.stderr)
		if m == nil {
			t.Fatalf("the error names no file:\n%s", res)
		}
		if _, err := os.Stat(filepath.Join(dir, m[1])); err == nil {
			t.Errorf("%s written although its chunk did not verify", m[1])
		}
		reg.Uncorrupt(bad)
	}
	for _, bad := range []string{base, delta} {
		reg.Corrupt(bad)
		// A cache of its own: what one mount decoded is not another's.
		mp := mount(t, ref, "--prefetch", "none", "--cache-dir", t.TempDir())
		var eio bool
		for _, f := range []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"} {
			_, err := os.ReadFile(filepath.Join(mp, f))
			eio = eio || errors.Is(err, syscall.EIO)
		}
		if !eio {
			t.Fatalf("reading through a mount with %s corrupted: no EIO", bad)
		}
		forceUnmount(t, mp)
		reg.Uncorrupt(bad)
	}
}

// TestDeltaSurvivesGC: deleting the base version (rm, gc --purge --apply)
// and the registry's garbage collector keep what a delta version needs: it
// lists its bases as layers.
func TestDeltaSurvivesGC(t *testing.T) {
	v1, v2 := rlStep(t, 12<<20)
	check := func(t *testing.T, repo string, registryGC func()) {
		pushDelta(t, repo+":v1", v1)
		p := pushDelta(t, repo+":v2", v2)
		if p.DeltaChunks == 0 {
			t.Fatalf("no delta: %+v", p)
		}
		if r := run(t, "rm", repo+":v1"); r.code != 0 {
			t.Fatalf("rm v1:\n%s", r)
		}
		res := run(t, "gc", repo, "--keep-last", "1", "--keep-tag", "no-such-tag", "--purge", "--restore-window", "0s", "--blob-grace", "0s", "--apply", "--json")
		if res.code != 0 {
			t.Fatalf("gc --purge --apply:\n%s", res)
		}
		if registryGC != nil {
			registryGC()
		}
		if r := run(t, "resolve", repo+":v1"); r.code == 0 {
			t.Fatalf("v1 still resolves after rm and purge:\n%s", r)
		}
		dir := filepath.Join(t.TempDir(), "pulled")
		pull(t, repo+"@"+p.Digest, dir, "--no-cache")
		compareTrees(t, v2, dir)
	}
	t.Run("distribution", func(t *testing.T) {
		reg := startRegistryBinary(t)
		check(t, reg.host+"/team/rl", reg.garbageCollect)
	})
	t.Run("oci-layout", func(t *testing.T) {
		check(t, "oci:"+filepath.Join(t.TempDir(), "rl"), nil)
	})
}

// push --base-dir: the bases of the deltas come from a local copy of the
// base version where they verify, so a push with deltas downloads almost
// nothing; the version is the one a push without it makes.
func TestDeltaPushBaseDir(t *testing.T) {
	reg := newDistribution(t)
	v1, v2 := rlStep(t, 24<<20)
	v3 := filepath.Join(t.TempDir(), "v3")
	if _, err := synth.Perturb(v2, v3, synth.PerturbOptions{Fraction: 0.02, Seed: 2}); err != nil {
		t.Fatal(err)
	}
	pushDelta(t, reg.Host+"/vols/local:v1", v1)
	// v1 of vols/fetched from a copy gone since: no local base is known.
	gone := filepath.Join(t.TempDir(), "gone")
	if err := synth.Generate(gone, synth.Options{TargetBytes: 24 << 20, Shards: 2, Seed: 43}); err != nil {
		t.Fatal(err)
	}
	pushDelta(t, reg.Host+"/vols/fetched:v1", gone)
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}
	fetched := pushDelta(t, reg.Host+"/vols/fetched:v2", v2)

	reg.ResetStats()
	local := pushDelta(t, reg.Host+"/vols/local:v2", v2, "--base-dir", v1)
	out := reg.Stats().BlobBytesOut
	if local.Digest != fetched.Digest || local.DeltaChunks == 0 {
		t.Fatalf("with --base-dir: %s with %d delta chunks, want %s (as without it)", local.Digest, local.DeltaChunks, fetched.Digest)
	}
	if local.BaseBytesFetched != 0 || local.BaseBytesLocal < local.DeltaChunkBytes || out > local.Bytes/100 {
		t.Errorf("with --base-dir: %d base bytes read locally, %d fetched, %d blob bytes served; want the %d bytes of bases all local", local.BaseBytesLocal, local.BaseBytesFetched, out, local.DeltaChunkBytes)
	}
	if fetched.BaseBytesFetched < fetched.DeltaChunkBytes {
		t.Errorf("without --base-dir: %d base bytes fetched, want the %d of the bases", fetched.BaseBytesFetched, fetched.DeltaChunkBytes)
	}

	// The next step against v2, whose chunks are deltas of v1's: v2's
	// files and its small deltas give back v1's chunks, the bases.
	reg.ResetStats()
	next := pushDelta(t, reg.Host+"/vols/local:v3", v3, "--base-dir", v2)
	if next.DeltaChunks == 0 || next.BaseBytesLocal == 0 {
		t.Fatalf("v3 against v2 with --base-dir: %+v", next)
	}
	if out := reg.Stats().BlobBytesOut; out > 2*local.BytesAsDeltas+next.Bytes/100 {
		t.Errorf("v3 with --base-dir %s: the registry served %d bytes, want about v2's deltas (%d)", v2, out, local.BytesAsDeltas)
	}

	// A local copy changed since is not trusted: the changed chunks'
	// bases are fetched, and the version is still the same one.
	lying := filepath.Join(t.TempDir(), "lying")
	if err := synth.Generate(lying, synth.Options{TargetBytes: 24 << 20, Shards: 2, Seed: 43}); err != nil {
		t.Fatal(err)
	}
	compareTrees(t, v1, lying)
	shards, _ := filepath.Glob(filepath.Join(lying, "*.safetensors"))
	if len(shards) == 0 {
		t.Fatal("no shard in the checkpoint")
	}
	f, err := os.OpenFile(shards[len(shards)-1], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	for _, off := range []int64{st.Size() / 3, st.Size() * 2 / 3} {
		if _, err := f.WriteAt([]byte{0xff, 0x00, 0xff}, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	pushDelta(t, reg.Host+"/vols/lying:v1", v1)
	got := pushDelta(t, reg.Host+"/vols/lying:v2", v2, "--base-dir", lying)
	if got.Digest != fetched.Digest || got.BaseBytesFetched == 0 || got.BaseBytesLocal == 0 {
		t.Errorf("with a changed local copy: %s, %d base bytes local, %d fetched; want %s, some of each", got.Digest, got.BaseBytesLocal, got.BaseBytesFetched, fetched.Digest)
	}
	cold := filepath.Join(t.TempDir(), "cold")
	pull(t, reg.Host+"/vols/lying@"+got.Digest, cold)
	compareTrees(t, v2, cold)

	// Without --base-dir: the directory this node last pushed to the
	// repository, when that push was the base version.
	pushDelta(t, reg.Host+"/vols/auto:v1", v1)
	auto := pushDelta(t, reg.Host+"/vols/auto:v2", v2)
	if auto.Digest != fetched.Digest || auto.BaseBytesFetched != 0 || auto.BaseBytesLocal < auto.DeltaChunkBytes {
		t.Errorf("after pushing v1 from its directory: %s, bases %d local, %d fetched; want %s, all local", auto.Digest, auto.BaseBytesLocal, auto.BaseBytesFetched, fetched.Digest)
	}
	if next := pushDelta(t, reg.Host+"/vols/auto:v3", v3); next.BaseBytesLocal == 0 {
		t.Errorf("v3 after pushing v2 from its directory: no base read locally: %+v", next)
	}
	// When the last push to the repository was not the base version,
	// its directory is not read.
	pushDelta(t, reg.Host+"/vols/other:v1", v1)
	pushDelta(t, reg.Host+"/vols/other:v3", v3, "--delta", "off")
	if o := pushDelta(t, reg.Host+"/vols/other:v2", v2, "--base", "v1"); o.BaseBytesLocal != 0 || o.BaseBytesFetched == 0 || o.Digest != fetched.Digest {
		t.Errorf("the last push to the repository was v3: %s, bases %d local, %d fetched; want %s, all fetched", o.Digest, o.BaseBytesLocal, o.BaseBytesFetched, fetched.Digest)
	}
}
