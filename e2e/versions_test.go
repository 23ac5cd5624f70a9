package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// versionJSON is one element of versions --json.
type versionJSON struct {
	Digest string    `json:"digest"`
	Sealed time.Time `json:"sealed"`
	Bytes  int64     `json:"bytes"`
	Files  int64     `json:"files"`
	Tags   []string  `json:"tags"`
}

// moveJSON is one move of history --json.
type moveJSON struct {
	Time     time.Time `json:"time"`
	Digest   string    `json:"digest"`
	Previous string    `json:"previous"`
	Op       string    `json:"op"`
}

// diffJSON is the part of diff --json the tests read.
type diffJSON struct {
	Added       []struct{ Path string } `json:"added"`
	Removed     []struct{ Path string } `json:"removed"`
	Changed     []struct{ Path string } `json:"changed"`
	Unchanged   int                     `json:"unchanged"`
	NewBytes    int64                   `json:"new_bytes"`
	SharedBytes int64                   `json:"shared_bytes"`
	UploadBytes int64                   `json:"upload_bytes"`
}

// waitNextSecond sleeps into the next wall-clock second, so that versions
// sealed before and after have distinct sealing times (protective tags
// have one-second resolution).
func waitNextSecond() {
	now := time.Now()
	time.Sleep(now.Truncate(time.Second).Add(time.Second + 10*time.Millisecond).Sub(now))
}

// llamaTrees builds three versions: v2 rewrites part of the weights and adds
// a file, v3 removes the tokenizer.
func llamaTrees(t *testing.T) [3]string {
	t.Helper()
	weights := randBytes(1, 1<<20)
	v2weights := slices.Clone(weights)
	copy(v2weights[600<<10:], randBytes(2, 100<<10))
	trees := [3][]node{
		{fileNode("weights.bin", 0o644, weights), fileNode("tokenizer.json", 0o644, []byte(`{"vocab":1}`)), fileNode("config.json", 0o644, []byte(`{"layers":2}`))},
		{fileNode("weights.bin", 0o644, v2weights), fileNode("tokenizer.json", 0o644, []byte(`{"vocab":1}`)), fileNode("config.json", 0o644, []byte(`{"layers":2}`)), fileNode("README.md", 0o644, []byte("v2\n"))},
		{fileNode("weights.bin", 0o644, v2weights), fileNode("config.json", 0o644, []byte(`{"layers":3}`)), fileNode("README.md", 0o644, []byte("v3\n"))},
	}
	var dirs [3]string
	for i, tr := range trees {
		dirs[i] = t.TempDir()
		buildTree(t, dirs[i], tr, time.Time{})
	}
	return dirs
}

// deleteVersion deletes the manifest d from a registry repository (by
// digest) or from an OCI layout (its index entries and its blob).
func deleteVersion(t *testing.T, tg target, name, d string) {
	t.Helper()
	if tg.reg != nil {
		req, err := http.NewRequest(http.MethodDelete, tg.reg.URL+"/v2/"+name+"/manifests/"+d, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("DELETE %s@%s: %s", name, d, resp.Status)
		}
		return
	}
	dir := filepath.Join(tg.root, name)
	var idx map[string]json.RawMessage
	mustJSON(t, fileContents(t, filepath.Join(dir, "index.json")), &idx)
	var ms []map[string]any
	mustJSON(t, idx["manifests"], &ms)
	ms = slices.DeleteFunc(ms, func(m map[string]any) bool { return m["digest"] == d })
	b, err := json.Marshal(ms)
	if err != nil {
		t.Fatal(err)
	}
	idx["manifests"] = b
	b, err = json.Marshal(idx)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, "index.json"), b)
	if err := os.Remove(filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))); err != nil {
		t.Fatal(err)
	}
}

// putNonVolume stores a plain OCI image manifest (not a volume) tagged tag
// next to the volume name.
func putNonVolume(t *testing.T, tg target, name, tag string) {
	t.Helper()
	m := []byte(`{"schemaVersion":2,"mediaType":"` + mtManifest + `","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2}]}`)
	if tg.reg != nil {
		uploadBlob(t, tg.reg, name, []byte("{}"))
		putManifest(t, tg.reg, name, tag, mtManifest, m)
		return
	}
	dir := filepath.Join(tg.root, name)
	d := digestOf(m)
	mustWrite(t, filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:")), m)
	mustWrite(t, filepath.Join(dir, "blobs", "sha256", "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"), []byte("{}"))
	var idx map[string]json.RawMessage
	mustJSON(t, fileContents(t, filepath.Join(dir, "index.json")), &idx)
	var ms []map[string]any
	mustJSON(t, idx["manifests"], &ms)
	ms = append(ms, map[string]any{"mediaType": mtManifest, "digest": d, "size": len(m),
		"annotations": map[string]string{"org.opencontainers.image.ref.name": tag}})
	b, _ := json.Marshal(ms)
	idx["manifests"] = b
	b, _ = json.Marshal(idx)
	mustWrite(t, filepath.Join(dir, "index.json"), b)
}

func TestVersionsTagsRollbackHistoryDiff(t *testing.T) {
	forTargets(t, func(t *testing.T, tg target) {
		const name = "team/llama"
		repo := tg.repo(name)
		dirs := llamaTrees(t)

		v1 := pushJSON(t, repo+":v1", dirs[0], smallChunks...)
		waitNextSecond()
		if tg.reg != nil {
			tg.reg.ResetStats()
		}
		v2 := pushJSON(t, repo+":v2", dirs[1], smallChunks...)
		var blobIn int64
		if tg.reg != nil {
			blobIn = tg.reg.Stats().BlobBytesIn
		}
		waitNextSecond()
		v3 := pushJSON(t, repo+":v3", dirs[2], append([]string{"--tag", "prod"}, smallChunks...)...)

		// resolve: REPO@sha256:<hex> for a tag and for a digest.
		var repoPrefix string
		if r := mustRun(t, "resolve", repo+":prod"); true {
			repoPrefix, _, _ = strings.Cut(r.lastLine(), "@")
			if r.lastLine() != repoPrefix+"@"+v3.Digest || !strings.HasSuffix(repoPrefix, name) {
				t.Fatalf("resolve prod: %q, want …%s@%s", r.lastLine(), name, v3.Digest)
			}
		}
		if r := mustRun(t, "resolve", repo+"@"+v1.Digest); r.lastLine() != repoPrefix+"@"+v1.Digest {
			t.Fatalf("resolve by digest: %q", r.lastLine())
		}
		if r := run(t, "resolve", repo+":nope"); r.code != 1 {
			t.Fatalf("resolve of a missing tag should exit 1:\n%s", r)
		}
		putNonVolume(t, tg, name, "image")
		if r := run(t, "resolve", repo+":image"); r.code != 1 || !strings.Contains(r.stderr, "not a bdnvol volume") {
			t.Fatalf("resolve of a non-volume should exit 1:\n%s", r)
		}

		// Rollback: prod v3 -> v1, and back.
		if r := mustRun(t, "tag", repo+"@"+v1.Digest, "prod"); r.lastLine() != repoPrefix+":prod@"+v1.Digest {
			t.Fatalf("tag: stdout %q", r.lastLine())
		}
		if r := mustRun(t, "resolve", repo+":prod"); r.lastLine() != repoPrefix+"@"+v1.Digest {
			t.Fatalf("after rollback prod is %q, want v1 %s", r.lastLine(), v1.Digest)
		}
		mustRun(t, "tag", repo+":v3", "prod")
		if r := mustRun(t, "resolve", repo+":prod"); r.lastLine() != repoPrefix+"@"+v3.Digest {
			t.Fatalf("after roll forward prod is %q, want v3", r.lastLine())
		}
		// Refusals: a non-volume, a missing digest, a reserved tag.
		if r := run(t, "tag", repo+":image", "prod"); r.code != 1 {
			t.Fatalf("tagging a non-volume should exit 1:\n%s", r)
		}
		if r := run(t, "tag", repo+"@sha256:"+strings.Repeat("ab", 32), "prod"); r.code != 1 {
			t.Fatalf("tagging a missing digest should exit 1:\n%s", r)
		}
		for _, reserved := range []string{"sealed-x", "history-x", "deleted-x"} {
			if r := run(t, "tag", repo+":v1", reserved); r.code != 2 {
				t.Fatalf("the reserved tag %s should exit 2:\n%s", reserved, r)
			}
		}
		if r := run(t, "push", "--tag", "history-x", repo+":v9", dirs[0]); r.code != 2 {
			t.Fatalf("push with a reserved tag should exit 2:\n%s", r)
		}

		// history shows the moves in order: the push, the rollback, the roll forward.
		var h struct {
			Tag     string     `json:"tag"`
			Current string     `json:"current"`
			Moves   []moveJSON `json:"moves"`
		}
		mustJSON(t, []byte(mustRun(t, "history", "--json", repo+":prod").stdout), &h)
		want := []moveJSON{
			{Op: "push", Digest: v3.Digest},
			{Op: "tag", Digest: v1.Digest, Previous: v3.Digest},
			{Op: "tag", Digest: v3.Digest, Previous: v1.Digest},
		}
		if h.Tag != "prod" || h.Current != v3.Digest || len(h.Moves) != len(want) {
			t.Fatalf("history: %+v", h)
		}
		for i, m := range h.Moves {
			if m.Op != want[i].Op || m.Digest != want[i].Digest || m.Previous != want[i].Previous {
				t.Errorf("move %d: %+v, want %+v", i, m, want[i])
			}
			if i > 0 && m.Time.Before(h.Moves[i-1].Time) {
				t.Errorf("move %d at %v is before move %d", i, m.Time, i-1)
			}
		}
		if r := mustRun(t, "history", repo+":prod"); strings.Count(r.stdout, "\n") != 4 || !strings.Contains(r.stdout, v1.Digest) {
			t.Errorf("history text:\n%s", r)
		}

		// versions lists all three, newest first, with their tags now.
		var vs []versionJSON
		mustJSON(t, []byte(mustRun(t, "versions", "--json", repo).stdout), &vs)
		wantVs := []struct {
			p    pushResult
			tags []string
		}{{v3, []string{"prod", "v3"}}, {v2, []string{"v2"}}, {v1, []string{"v1"}}}
		if len(vs) != 3 {
			t.Fatalf("versions: %+v", vs)
		}
		for i, v := range vs {
			w := wantVs[i]
			if v.Digest != w.p.Digest || !slices.Equal(v.Tags, w.tags) || v.Bytes != w.p.Bytes || v.Files != w.p.Files {
				t.Errorf("version %d: %+v, want %s %v bytes %d files %d", i, v, w.p.Digest, w.tags, w.p.Bytes, w.p.Files)
			}
			if i > 0 && !v.Sealed.Before(vs[i-1].Sealed) {
				t.Errorf("version %d sealed %v, not before %v", i, v.Sealed, vs[i-1].Sealed)
			}
		}
		if r := mustRun(t, "versions", repo); !strings.Contains(r.stdout, "prod,v3") || strings.Count(r.stdout, "\n") != 4 {
			t.Errorf("versions table:\n%s", r)
		}

		// diff v1 v2: file changes, and chunk numbers equal to what the push of v2 uploaded.
		var d diffJSON
		mustJSON(t, []byte(mustRun(t, "diff", "--json", repo+":v1", repo+":v2").stdout), &d)
		if len(d.Added) != 1 || d.Added[0].Path != "README.md" || len(d.Removed) != 0 ||
			len(d.Changed) != 1 || d.Changed[0].Path != "weights.bin" || d.Unchanged != 2 {
			t.Errorf("diff files: %+v", d)
		}
		if d.UploadBytes != v2.BytesUploaded {
			t.Errorf("diff says a push of v2 on v1 uploads %d bytes; the push uploaded %d", d.UploadBytes, v2.BytesUploaded)
		}
		if d.SharedBytes == 0 || d.NewBytes == 0 || d.NewBytes > d.UploadBytes {
			t.Errorf("diff chunks: %+v", d)
		}
		if tg.reg != nil && (blobIn < d.NewBytes || blobIn > d.UploadBytes) {
			t.Errorf("registry received %d blob bytes for v2; diff says %d new chunk bytes, %d in all", blobIn, d.NewBytes, d.UploadBytes)
		}
		var d3 diffJSON
		mustJSON(t, []byte(mustRun(t, "diff", "--json", repo+":v2", repo+":v3").stdout), &d3)
		if len(d3.Removed) != 1 || d3.Removed[0].Path != "tokenizer.json" || len(d3.Changed) != 2 {
			t.Errorf("diff v2 v3: %+v", d3)
		}

		// inspect
		var in struct {
			Digest        string   `json:"digest"`
			FormatVersion int      `json:"format_version"`
			Tags          []string `json:"tags"`
			Chunks        int      `json:"chunks"`
			UniqueBytes   int64    `json:"unique_bytes"`
			Files         []struct {
				Path   string `json:"path"`
				Size   int64  `json:"size"`
				Mode   uint32 `json:"mode"`
				SHA256 string `json:"sha256"`
			} `json:"files"`
		}
		mustJSON(t, []byte(mustRun(t, "inspect", "--json", repo+":v2").stdout), &in)
		if in.Digest != v2.Digest || in.FormatVersion != 2 || !slices.Equal(in.Tags, []string{"v2"}) ||
			int64(len(in.Files)) != v2.Files || int64(in.Chunks) != v2.Chunks || in.UniqueBytes < v2.Bytes {
			t.Errorf("inspect: %+v (push said %+v)", in, v2)
		}
		for _, f := range in.Files {
			if f.Path == "README.md" && (f.Size != 3 || f.SHA256 != strings.TrimPrefix(digestOf([]byte("v2\n")), "sha256:") || f.Mode&0o777 != 0o644) {
				t.Errorf("inspect README.md: %+v", f)
			}
		}
	})
}
