package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// dedupPush is the JSON object `bdnvol push --json` prints.
type dedupPush struct {
	Digest         string `json:"digest"`
	Bytes          int64  `json:"bytes"`
	Chunks         int64  `json:"chunks"`
	ChunksUploaded int64  `json:"chunks_uploaded"`
	BytesUploaded  int64  `json:"bytes_uploaded"`
}

func dedupPushJSON(t *testing.T, ref, dir string) dedupPush {
	t.Helper()
	res := mustRun(t, "push", "--json", ref, dir)
	var p dedupPush
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.stdout)), &p); err != nil || !strings.HasPrefix(p.Digest, "sha256:") {
		t.Fatalf("push --json: want one JSON object with a digest (%v):\n%s", err, res)
	}
	return p
}

// metadataBytes is the size of what describes a version rather than holds
// its file bytes: the manifests (a root index and its parts, or one
// manifest), their non-empty configs and the file index blobs.
func metadataBytes(t *testing.T, reg *registry, repo, ref string) int64 {
	t.Helper()
	body, _ := getManifest(t, reg, repo, ref, manifestAccepts)
	var m ociManifest
	mustJSON(t, body, &m)
	n := int64(len(body))
	for _, d := range m.Manifests {
		n += metadataBytes(t, reg, repo, d.Digest)
	}
	if m.Config != nil && m.Config.Digest != emptyDigest {
		n += m.Config.Size
	}
	for _, l := range m.Layers {
		if l.MediaType != mtChunk {
			n += l.Size
		}
	}
	return n
}

// chunkingOf reads the chunking parameters from the file index of a
// version (in its root manifest or, for a root index, its first part).
func chunkingOf(t *testing.T, reg *registry, repo, ref string) chunking {
	t.Helper()
	body, _ := getManifest(t, reg, repo, ref, manifestAccepts)
	var m ociManifest
	mustJSON(t, body, &m)
	if len(m.Manifests) > 0 {
		return chunkingOf(t, reg, repo, m.Manifests[0].Digest)
	}
	for _, l := range m.Layers {
		if l.MediaType == mtFileIndex || l.MediaType == mtTopIndex {
			var idx struct {
				Chunking chunking `json:"chunking"`
			}
			mustJSON(t, getBlob(t, reg, repo, l.Digest), &idx)
			return idx.Chunking
		}
	}
	t.Fatalf("%s:%s has no file index layer: %s", repo, ref, body)
	return chunking{}
}

// TestFineTuneDedup pushes a synthetic checkpoint, then a fine-tune of it in
// which 30% of the tensor bytes got new values and one shard got a new
// tensor that shifts every later tensor of that shard, and checks that the
// second push uploads little more than the changed tensors.
func TestFineTuneDedup(t *testing.T) {
	bin(t)
	reg := newDistribution(t)
	repo := "model"
	base := t.TempDir()
	v1, v2 := filepath.Join(base, "v1"), filepath.Join(base, "v2")

	// ~24 MiB in 3 shards; hidden 768 and intermediate 1024 make every
	// matrix at least 1 MiB (the default minimum chunk, checked below), as
	// in real models, so each is chunked on its own.
	opts := synth.Options{TargetBytes: 24 << 20, Shards: 3, Seed: 1, Layers: 2, Hidden: 768, Intermediate: 1024}
	if err := synth.Generate(v1, opts); err != nil {
		t.Fatal(err)
	}
	first := dedupPushJSON(t, reg.Host+"/"+repo+":v1", v1)
	t.Logf("v1: %+v", first)

	minChunk := chunkingOf(t, reg, repo, "v1").Min
	for i := 0; i < opts.Shards; i++ {
		s, err := synth.ReadShard(filepath.Join(v1, synth.ShardName(i, opts.Shards)))
		if err != nil {
			t.Fatal(err)
		}
		for _, ts := range s.Tensors {
			if len(ts.Shape) == 2 && ts.Size() < minChunk {
				t.Fatalf("premise: matrix %s is %d bytes, under the default minimum chunk of %d", ts.Name, ts.Size(), minChunk)
			}
		}
	}

	rep, err := synth.FineTune(v1, v2, synth.FineTuneOptions{Fraction: 0.30, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	if rep.ChangedTensorBytes == 0 || rep.NewTensorBytes == 0 {
		t.Fatalf("fine-tune changed nothing: %+v", rep)
	}

	reg.ResetStats()
	second := dedupPushJSON(t, reg.Host+"/"+repo+":v2", v2)
	blobIn := reg.Stats().BlobBytesIn
	if second.Digest == first.Digest {
		t.Fatalf("v2 has the digest of v1: %s", second.Digest)
	}
	if second.Bytes != rep.TotalBytes {
		t.Errorf("push reports %d bytes, the fine-tune holds %d", second.Bytes, rep.TotalBytes)
	}

	// Allowance, from actual sizes: the safetensors headers that changed
	// (each is its own chunk), the pack of small files holding the changed
	// index.json (the pack is re-uploaded whole), and the version's own
	// metadata (manifest and file index).
	var smallFiles int64
	if len(rep.ChangedFiles) > 0 {
		entries, err := os.ReadDir(v2)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			fi, err := e.Info()
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().IsRegular() && fi.Size() < minChunk {
				smallFiles += fi.Size()
			}
		}
	}
	meta := metadataBytes(t, reg, repo, "v2")
	changed := rep.ChangedTensorBytes + rep.NewTensorBytes
	allowance := rep.ChangedHeaderBytes + smallFiles + meta
	limit := int64(1.05*float64(changed)) + allowance
	t.Logf("fine-tune: %d tensor bytes rewritten + %d new of %d (%.1f%%); headers %d, small files %d, metadata %d",
		rep.ChangedTensorBytes, rep.NewTensorBytes, rep.TensorBytes, 100*rep.Fraction(), rep.ChangedHeaderBytes, smallFiles, meta)
	t.Logf("v2: bytes_uploaded %d (registry saw %d blob bytes), limit %d = 1.05×%d + %d; a whole-file push would send %d",
		second.BytesUploaded, blobIn, limit, changed, allowance, rep.TotalBytes)
	if second.BytesUploaded > limit {
		t.Errorf("v2 push reports %d bytes uploaded, want <= %d", second.BytesUploaded, limit)
	}
	if blobIn > limit {
		t.Errorf("the registry received %d blob bytes for v2, want <= %d", blobIn, limit)
	}
	if second.BytesUploaded == 0 || second.ChunksUploaded == 0 {
		t.Errorf("v2 push uploaded nothing: %+v", second)
	}

	// Pulls are bit-exact, v2 and the v1 it shares chunks with.
	out2 := filepath.Join(t.TempDir(), "out")
	mustRun(t, "pull", reg.Host+"/"+repo+":v2", out2)
	compareTrees(t, v2, out2)
	out1 := filepath.Join(t.TempDir(), "out")
	mustRun(t, "pull", reg.Host+"/"+repo+":v1", out1)
	compareTrees(t, v1, out1)
}
