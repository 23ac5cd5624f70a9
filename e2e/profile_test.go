package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// profileDoc is a startup profile document as the CLI writes it.
type profileDoc struct {
	MediaType string   `json:"mediaType"`
	Version   string   `json:"version"`
	Chunks    []string `json:"chunks"`
}

// chunksOf returns the digests of the chunks of the file at path, in file
// order.
func chunksOf(t *testing.T, idx *fileIndex, path string) []string {
	t.Helper()
	for _, f := range idx.Files {
		if f.Path == path {
			var out []string
			for _, x := range f.Extents {
				if d := idx.Chunks[x[0]].Digest; !slices.Contains(out, d) {
					out = append(out, d)
				}
			}
			return out
		}
	}
	t.Fatalf("%s: not in the index", path)
	return nil
}

// cachedChunks returns which of ds the chunk cache in cacheDir holds.
func cachedChunks(cacheDir string, ds []string) []string {
	var out []string
	for _, d := range ds {
		if _, err := os.Stat(filepath.Join(cacheDir, "chunks", "sha256", strings.TrimPrefix(d, "sha256:"))); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// TestProfileRecordPushReplay records what a command reads through a real
// FUSE mount, attaches it to the version, and checks that a mount on a
// fresh cache fetches the profile's chunks before anything reads them,
// and nothing else; with --profile off it fetches none of them.
func TestProfileRecordPushReplay(t *testing.T) {
	requireFUSE(t)
	reg := newDistribution(t)
	tg := target{name: "distribution", reg: reg}
	src := filepath.Join(t.TempDir(), "ckpt")
	if err := synth.Generate(src, synth.Options{TargetBytes: 8 << 20, Shards: 2, Layers: 2, Seed: 11}); err != nil {
		t.Fatal(err)
	}
	repo := reg.Host + "/models/profiled"
	d := push(t, repo, repo+":v1", src, smallChunks...)
	_, idx := checkRoot(t, tg, "models/profiled", d)
	if idx == nil {
		t.Fatal("test data: a split root")
	}
	shards, _ := filepath.Glob(filepath.Join(src, "*.safetensors"))
	read, other := filepath.Base(shards[0]), filepath.Base(shards[1])
	want, rest := chunksOf(t, idx, read), chunksOf(t, idx, other)

	// Record: the command reads one shard through the mount.
	file := filepath.Join(t.TempDir(), "profile.json")
	res := mustRun(t, "--cache-dir", filepath.Join(t.TempDir(), "c1"), "profile", "record", repo+":v1", "-o", file,
		"--quiet", "3s", "--", "sh", "-c", `cat "$BDNVOL_MOUNT/`+read+`" > /dev/null`)
	if res.lastLine() != file {
		t.Fatalf("record printed %q, want the file\n%s", res.lastLine(), res)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var p profileDoc
	mustJSON(t, b, &p)
	if p.MediaType != "application/vnd.bdnvol.profile.v1+json" || p.Version != d {
		t.Fatalf("profile: media type %q, version %s; want version %s", p.MediaType, p.Version, d)
	}
	got := slices.Clone(p.Chunks)
	slices.Sort(got)
	sorted := slices.Clone(want)
	slices.Sort(sorted)
	if !slices.Equal(got, sorted) || p.Chunks[0] != want[0] {
		t.Fatalf("profile lists %d chunks starting %.19s, want the %d chunks of %s starting %.19s", len(p.Chunks), p.Chunks[0], len(want), read, want[0])
	}
	if strings.Contains(string(b), read) || strings.Contains(string(b), reg.Host) {
		t.Fatalf("the profile names the file or the registry:\n%s", b)
	}

	// Share it, and see it from a fresh node.
	mustRun(t, "profile", "push", repo+":v1", file)
	if res := mustRun(t, "--cache-dir", filepath.Join(t.TempDir(), "c2"), "profile", "show", repo+"@"+d); !strings.Contains(res.stdout, "(referrer)") {
		t.Fatalf("profile show did not find the referrer:\n%s", res)
	}

	// A mount on a fresh cache fetches the profile's chunks with no reader.
	fresh := filepath.Join(t.TempDir(), "c3")
	reg.ResetStats()
	mountIn(t, fresh, repo+"@"+d, "--prefetch", "none")
	deadline := time.Now().Add(60 * time.Second)
	for len(cachedChunks(fresh, want)) < len(want) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := len(cachedChunks(fresh, want)); n != len(want) {
		t.Fatalf("with no reader, the mount cached %d of the profile's %d chunks", n, len(want))
	}
	reg.Settle(t)
	if extra := cachedChunks(fresh, rest); len(extra) > 0 {
		t.Fatalf("the mount also fetched %d chunks of %s, which the profile does not list", len(extra), other)
	}
	t.Logf("replay: %d chunks, %d blob bytes, %v", len(want), reg.Stats().BlobBytesOut, reg.Stats().Requests)

	// --profile off fetches none of them.
	off := filepath.Join(t.TempDir(), "c4")
	mountIn(t, off, repo+"@"+d, "--prefetch", "none", "--profile", "off")
	time.Sleep(time.Second)
	reg.Settle(t)
	if n := len(cachedChunks(off, want)); n != 0 {
		t.Fatalf("--profile off: %d of the profile's chunks cached with no reader", n)
	}

	// A profile of another version is ignored: nothing is fetched for it.
	d2 := push(t, repo, repo+":v2", filepath.Join(src), append([]string{"--chunk-avg", "128KiB"}, smallChunks[0:2]...)...)
	if d2 == d {
		t.Fatal("test data: v2 is v1")
	}
	_, idx2 := checkRoot(t, tg, "models/profiled", d2)
	c5 := filepath.Join(t.TempDir(), "c5")
	mp := mountIn(t, c5, repo+"@"+d2, "--prefetch", "none", "--profile", file)
	time.Sleep(time.Second)
	reg.Settle(t)
	if n := len(cachedChunks(c5, chunksOf(t, idx2, read))); n != 0 {
		t.Fatalf("a profile of another version fetched %d chunks", n)
	}
	if _, err := os.ReadFile(filepath.Join(mp, read)); err != nil {
		t.Fatalf("reading through the mount: %v", err)
	}
}

// mountIn is mount with the chunk cache in cacheDir.
func mountIn(t *testing.T, cacheDir, ref string, flags ...string) string {
	t.Helper()
	return mount(t, ref, append(flags, "--cache-dir", cacheDir)...)
}
