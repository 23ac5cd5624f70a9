package e2e

import (
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// TestDiffTensors: diff --tensors of the synthetic checkpoint and its
// fine-tune names exactly the rewritten and the inserted tensors, and
// fetches no chunk but the shards' header chunks.
func TestDiffTensors(t *testing.T) {
	reg := newDistribution(t)
	proxy := newFaultProxy(t, reg)
	repo := proxy.Host + "/models/tensors"
	v1, v2 := filepath.Join(t.TempDir(), "v1"), filepath.Join(t.TempDir(), "v2")
	opts := synth.Options{TargetBytes: 24 << 20, Shards: 3, Seed: 1, Layers: 2, Hidden: 768, Intermediate: 1024}
	if err := synth.Generate(v1, opts); err != nil {
		t.Fatal(err)
	}
	rep, err := synth.FineTune(v1, v2, synth.FineTuneOptions{Fraction: 0.30, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	a := pushJSON(t, repo+":v1", v1)
	b := pushJSON(t, repo+":v2", v2)

	type tensorDiff struct {
		Files   []string `json:"files"`
		Added   []struct{ File, Name string }
		Removed []struct{ File, Name string }
		Changed []struct {
			Name string   `json:"name"`
			What []string `json:"what"`
		}
		Undecided []struct {
			Name  string `json:"name"`
			Bytes int64  `json:"bytes"`
		}
		Unchanged      int   `json:"unchanged"`
		AddedBytes     int64 `json:"added_bytes"`
		ChangedBytes   int64 `json:"changed_bytes"`
		UndecidedBytes int64 `json:"undecided_bytes"`
		HeaderChunks   int   `json:"header_chunks"`
		SharedChunks   int   `json:"shared_chunks_fetched"`
	}
	diff := func(flags ...string) tensorDiff {
		proxy.Set(faultConfig{})
		res := mustRun(t, append(append([]string{"diff", "--tensors", "--json"}, flags...), repo+":v1", repo+":v2")...)
		var d tensorDiff
		mustJSON(t, []byte(res.stdout), &d)
		if len(d.Files) != opts.Shards {
			t.Errorf("files %v, want %d shards", d.Files, opts.Shards)
		}
		if len(d.Added) != 1 || d.Added[0].Name != rep.NewTensor || d.Added[0].File != rep.NewTensorShard || d.AddedBytes != rep.NewTensorBytes {
			t.Errorf("added %+v (%d bytes), want %s in %s (%d bytes)", d.Added, d.AddedBytes, rep.NewTensor, rep.NewTensorShard, rep.NewTensorBytes)
		}
		if len(d.Removed) != 0 || d.Unchanged == 0 {
			t.Errorf("removed %+v, %d unchanged", d.Removed, d.Unchanged)
		}
		for _, c := range d.Changed {
			if !slices.Equal(c.What, []string{"bytes"}) {
				t.Errorf("%s changed %v, want bytes only", c.Name, c.What)
			}
		}
		return d
	}
	names := func(d tensorDiff, undecided bool) []string {
		var out []string
		for _, c := range d.Changed {
			out = append(out, c.Name)
		}
		if undecided {
			for _, u := range d.Undecided {
				out = append(out, u.Name)
			}
		}
		sort.Strings(out)
		return out
	}
	// From headers and indexes only: the rewritten tensors are changed, or
	// undecided when small tensors share a chunk (never an unchanged one).
	d := diff()
	if got := names(d, true); !slices.Equal(got, rep.ChangedTensors) || d.ChangedBytes+d.UndecidedBytes != rep.ChangedTensorBytes {
		t.Errorf("changed and undecided %v,\nwant %v", got, rep.ChangedTensors)
	}
	for _, u := range d.Undecided {
		if u.Bytes >= 1<<20 {
			t.Errorf("undecided %s of %d bytes: large tensors have chunks of their own", u.Name, u.Bytes)
		}
	}
	// Blobs fetched: the metadata of both versions and the header chunks,
	// nothing else.
	meta := map[string]bool{}
	for _, tag := range []string{"v1", "v2"} {
		metadataBlobs(t, reg, "models/tensors", tag, meta)
	}
	chunks := 0
	for dg := range proxy.blobGets() {
		if !meta[dg] {
			chunks++
		}
	}
	if chunks != d.HeaderChunks || chunks > 2*opts.Shards {
		t.Errorf("%d chunks fetched (diff says %d header chunks), want at most one per shard and version (%d)", chunks, d.HeaderChunks, 2*opts.Shards)
	}
	// --resolve fetches the shared chunks and names exactly the rewritten.
	r := diff("--resolve")
	if got := names(r, false); !slices.Equal(got, rep.ChangedTensors) || r.ChangedBytes != rep.ChangedTensorBytes || len(r.Undecided) != 0 {
		t.Errorf("--resolve: changed %v, undecided %+v,\nwant %v", got, r.Undecided, rep.ChangedTensors)
	}
	if len(d.Undecided) > 0 && r.SharedChunks == 0 {
		t.Errorf("--resolve fetched no shared chunk for %d undecided tensors", len(d.Undecided))
	}
	t.Logf("v1 %s, v2 %s: %d changed, %d unchanged, %d header chunks, %d blob GETs", a.Digest, b.Digest, len(d.Changed), d.Unchanged, d.HeaderChunks, len(proxy.blobGets()))
}

// metadataBlobs adds to meta the blobs of the version at ref that are not
// chunks: configs and file indexes, through the part manifests.
func metadataBlobs(t testing.TB, reg *registry, name, ref string, meta map[string]bool) {
	t.Helper()
	b, _ := getManifest(t, reg, name, ref, "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json")
	var m ociManifest
	mustJSON(t, b, &m)
	for _, p := range m.Manifests {
		metadataBlobs(t, reg, name, p.Digest, meta)
	}
	if m.Config != nil {
		meta[m.Config.Digest] = true
	}
	for _, l := range m.Layers {
		if l.MediaType != "application/vnd.bdnvol.chunk.v1" {
			meta[l.Digest] = true
		}
	}
}
