package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// syncOCIReport is what sync --json prints (the fields these tests read).
type syncOCIReport struct {
	Digest         string `json:"digest"`
	Reference      string `json:"reference"`
	Commit         string `json:"commit"`
	Files          int64  `json:"files"`
	Bytes          int64  `json:"bytes"`
	ChunksUploaded int64  `json:"chunks_uploaded"`
	BytesUploaded  int64  `json:"bytes_uploaded"`
	FilesUnchanged int    `json:"files_unchanged"`
}

func syncOCI(t *testing.T, src, dst string, flags ...string) syncOCIReport {
	t.Helper()
	res := mustRun(t, append(append([]string{"sync", "--json"}, flags...), src, dst)...)
	var r syncOCIReport
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.stdout)), &r); err != nil || !digestRE.MatchString(r.Digest) {
		t.Fatalf("sync --json: want one JSON object (%v):\n%s", err, res)
	}
	return r
}

// ociSourceRef is the sync source naming name:tag of tg: oci://HOST/REPO:TAG
// for a registry, oci:PATH:TAG for a layout.
func ociSourceRef(tg target, name, tag string) string {
	if tg.reg != nil {
		return "oci://" + tg.repo(name) + ":" + tag
	}
	return tg.repo(name) + ":" + tag
}

// rootAnnotations returns the annotations of the manifest ref (REPO@DIGEST)
// of registry reg.
func rootAnnotations(t *testing.T, reg *registry, name, digest string) map[string]string {
	t.Helper()
	var man struct {
		Annotations map[string]string `json:"annotations"`
	}
	body, _ := getManifest(t, reg, name, digest, "application/vnd.oci.image.manifest.v1+json")
	mustJSON(t, body, &man)
	return man.Annotations
}

// TestSyncOCIImportsAModelPackModel imports a ModelPack model of every
// packing (raw, tar with a PAX name, tar+gzip, doc and code layers) from
// each registry and an OCI layout with `bdnvol sync oci://…`: the version
// holds the model's files byte for byte, records the source and the
// manifest digest the tag was pinned to, and the job records that pin.
// It logs the bytes read from the source against the model's size.
func TestSyncOCIImportsAModelPackModel(t *testing.T) {
	forTargets(t, func(t *testing.T, tg target) {
		syncEnv(t, nil)
		m := mixedModel(t)
		m.push(t, tg, "mp/mixed", "v1")
		dst := newDistribution(t)
		repo := dst.Host + "/team/imported"
		if tg.reg != nil {
			tg.reg.ResetStats()
		}
		r := syncOCI(t, ociSourceRef(tg, "mp/mixed", "v1"), repo+":v1")
		if r.Commit != m.digest {
			t.Errorf("sync --json commit %q, want the source manifest %s", r.Commit, m.digest)
		}
		var size int64
		for _, l := range m.layers {
			size += int64(len(l.blob))
		}
		if tg.reg != nil {
			st := tg.reg.Stats()
			t.Logf("source: %d blob bytes read for layers of %d bytes (%.3fx), %d requests %v", st.BlobBytesOut, size, float64(st.BlobBytesOut)/float64(size), total(st.Requests), st.Requests)
			// Every layer is read once: the raw ones by range, the small
			// tar and tar+gzip whole (their files kept in memory).
			if st.BlobBytesOut > size || st.Requests["GET blob"] > len(m.layers) {
				t.Errorf("read %d bytes from the source for a model of %d bytes", st.BlobBytesOut, size)
			}
		}
		dir := filepath.Join(t.TempDir(), "out")
		mustRun(t, "pull", r.Reference, dir)
		checkModelTree(t, dir, m)

		ann := rootAnnotations(t, dst, "team/imported", r.Digest)
		wantSrc := ociSourceRef(tg, "mp/mixed", "v1") + "@" + m.digest
		if ann["io.bdnvol.source"] != wantSrc || ann["io.bdnvol.source.revision"] != m.digest {
			t.Errorf("annotations %v, want io.bdnvol.source %s and io.bdnvol.source.revision %s", ann, wantSrc, m.digest)
		}
		js := syncJobs(t)
		if len(js) != 1 || js[0].Source != wantSrc || js[0].State != "SUCCEEDED" {
			t.Errorf("jobs: %+v, want one SUCCEEDED job whose source is pinned to %s", js, wantSrc)
		}
		// A re-import of the same manifest seals the same version and
		// uploads only the tags' manifests.
		again := syncOCI(t, ociSourceRef(tg, "mp/mixed", "v1"), repo+":v1")
		if again.Digest != r.Digest || again.ChunksUploaded != 0 {
			t.Errorf("re-import: %+v, want %s and no chunk uploaded", again, r.Digest)
		}
	})
}

// TestSyncOCIExportThenImportIsBitIdentical exports a version of a
// generated checkpoint as a ModelPack view and imports the view with
// `sync oci://` into another registry: the imported version verifies
// against the original tree (sizes, modes aside, SHA-256 of every file) and
// has the same file digests as the version exported.
func TestSyncOCIExportThenImportIsBitIdentical(t *testing.T) {
	syncEnv(t, nil)
	reg := newDistribution(t)
	src := filepath.Join(t.TempDir(), "src")
	if err := synth.Generate(src, synth.Options{TargetBytes: 24 << 20, Shards: 3, Seed: 31}); err != nil {
		t.Fatal(err)
	}
	repo := reg.Host + "/team/mp"
	p := dedupPushJSON(t, repo+":v1", src)
	e := exportModelPack(t, repo+":v1")

	dst := newDistribution(t)
	reg.ResetStats()
	r := syncOCI(t, "oci://"+repo+"@"+e.Digest, dst.Host+"/team/back:v1")
	st := reg.Stats()
	t.Logf("import of the view (%d layers, %d bytes): read %d blob bytes from the source (%.3fx), uploaded %d bytes", e.Layers, e.Bytes, st.BlobBytesOut, float64(st.BlobBytesOut)/float64(e.Bytes), r.BytesUploaded)
	if st.BlobBytesOut > e.Bytes+1<<20 {
		t.Errorf("read %d bytes from the source for a view of %d bytes", st.BlobBytesOut, e.Bytes)
	}
	if r.Bytes != p.Bytes {
		t.Errorf("imported %d bytes, the version holds %d", r.Bytes, p.Bytes)
	}
	mustRun(t, "verify", r.Reference, src)
	back := filepath.Join(t.TempDir(), "back")
	mustRun(t, "pull", r.Reference, back)
	compareContents(t, src, back)

	want := fileDigests(t, repo+"@"+p.Digest)
	got := fileDigests(t, r.Reference)
	if len(want) == 0 || fmt.Sprint(want) != fmt.Sprint(got) {
		t.Errorf("file digests differ:\nexported %v\nimported %v", want, got)
	}
}

// fileDigests returns path → digest of the files inspect --json lists.
func fileDigests(t *testing.T, ref string) map[string]string {
	t.Helper()
	res := mustRun(t, "inspect", "--json", ref)
	var v struct {
		Files []struct {
			Path   string `json:"path"`
			Type   string `json:"type"`
			Digest string `json:"sha256"`
		} `json:"files"`
	}
	mustJSON(t, []byte(res.stdout), &v)
	out := map[string]string{}
	for _, f := range v.Files {
		if f.Digest != "" {
			out[f.Path] = f.Digest
		}
	}
	return out
}

// TestSyncOCICorruptLayerFailsAndTagsNothing serves a corrupted layer (a
// raw one, an uncompressed tar and a gzip tar, in turn) from the source
// registry: the job fails naming the digest mismatch, and the destination
// gets no tag.
func TestSyncOCICorruptLayerFailsAndTagsNothing(t *testing.T) {
	syncEnv(t, nil)
	src := newDistribution(t)
	m := mixedModel(t)
	m.push(t, target{name: "distribution", reg: src}, "mp/mixed", "v1")
	for _, i := range []int{0, 1, 2} {
		l := m.layers[i]
		t.Run(l.mediaType[strings.LastIndexByte(l.mediaType, '.')+1:], func(t *testing.T) {
			dst := newDistribution(t)
			d := digestOf(l.blob)
			src.Corrupt(d)
			defer src.Uncorrupt(d)
			res := run(t, "sync", "oci://"+src.Host+"/mp/mixed:v1", dst.Host+"/team/bad:v1")
			if res.code != 1 || !strings.Contains(res.stderr, "does not match") {
				t.Fatalf("sync of a corrupt layer: want exit 1 naming the mismatch:\n%s", res)
			}
			t.Logf("%s", res.stderr[strings.LastIndex(strings.TrimSpace(res.stderr), "\n")+1:])
			if tags := listTags(t, dst, "team/bad"); len(tags) != 0 {
				t.Errorf("the destination has tags %v after a failed import", tags)
			}
			js := syncJobs(t)
			if len(js) == 0 || js[0].State != "FAILED" {
				t.Errorf("jobs: %+v, want the job FAILED", js)
			}
		})
	}
}

// TestSyncOCIChangedReleaseUploadsTheChangedTensors imports a release of
// a model (a raw safetensors layer, and a safetensors file in a tar layer
// as modctl packs them) and then the next release, in which one tensor of
// of the first two files changed and the third did not: the second import
// uploads within 1.05x of the changed tensors' bytes, and reads from the
// source only the changed files (the raw layer that did not change has
// the digest of a file of the first import: it is not read).
func TestSyncOCIChangedReleaseUploadsTheChangedTensors(t *testing.T) {
	syncEnv(t, nil)
	src := newDistribution(t)
	dst := newDistribution(t)
	const tensor = 4 << 20
	sizes := []int{tensor, tensor, tensor, tensor, tensor, tensor}
	a, startsA := mpSafetensors(sizes...)
	b, startsB := mpSafetensors(sizes...)
	c, startsC := mpSafetensors(tensor, tensor)
	for i := range startsB {
		b[startsB[i]+100] ^= 0x55 // not the tensors of a
	}
	for i := range startsC {
		c[startsC[i]+200] ^= 0x33
	}
	release := func(tag string, a, b []byte, cfg string) {
		files := map[string][]byte{"model-a.safetensors": a, "model-b.safetensors": b, "model-c.safetensors": c, "config.json": []byte(cfg)}
		m := newModel(t, files,
			mpLayer{mpType("weight", "raw"), a, "model-a.safetensors"},
			mpLayer{mpType("weight", "tar"), mpTar(t, false, mpMember{name: "model-b.safetensors", data: b}), "model-b.safetensors"},
			mpLayer{mpType("weight", "raw"), c, "model-c.safetensors"},
			mpLayer{mpType("weight.config", "raw"), []byte(cfg), "config.json"})
		m.push(t, target{name: "distribution", reg: src}, "mp/llm", tag)
	}
	release("r1", a, b, `{"release":1}`)
	r1 := syncOCI(t, "oci://"+src.Host+"/mp/llm:r1", dst.Host+"/team/llm:r1")

	// r2: one tensor of each weight file rewritten.
	a2 := append([]byte(nil), a...)
	b2 := append([]byte(nil), b...)
	for k := range tensor {
		a2[startsA[2]+int64(k)] ^= byte(k*31 + 1)
		b2[startsB[4]+int64(k)] ^= byte(k*17 + 3)
	}
	release("r2", a2, b2, `{"release":2}`)
	src.ResetStats()
	r2 := syncOCI(t, "oci://"+src.Host+"/mp/llm:r2", dst.Host+"/team/llm:r2")
	st := src.Stats()
	changed := int64(2*tensor + len(`{"release":2}`))
	ratio := float64(r2.BytesUploaded) / float64(changed)
	t.Logf("release 1: %d bytes uploaded of %d; release 2: %d bytes uploaded for %d bytes of changed tensors (%.3fx); source read %d blob bytes for a model of %d bytes",
		r1.BytesUploaded, r1.Bytes, r2.BytesUploaded, changed, ratio, st.BlobBytesOut, r2.Bytes)
	if ratio > 1.05 {
		t.Errorf("release 2 uploaded %d bytes, %.3fx the %d bytes of changed tensors, want at most 1.05x", r2.BytesUploaded, ratio, changed)
	}
	if r2.FilesUnchanged != 1 {
		t.Errorf("release 2: files_unchanged %d, want 1 (model-c.safetensors, whose raw layer did not change, is not read)", r2.FilesUnchanged)
	}
	if st.BlobBytesOut > int64(len(a2)+len(b2))+1<<20 {
		t.Errorf("release 2 read %d bytes from the source", st.BlobBytesOut)
	}
	dir := filepath.Join(t.TempDir(), "r2")
	mustRun(t, "pull", r2.Reference, dir)
	if got := fileContents(t, filepath.Join(dir, "model-b.safetensors")); !bytes.Equal(got, b2) {
		t.Error("model-b.safetensors of release 2 differs from the source's")
	}
	if got := fileContents(t, filepath.Join(dir, "model-a.safetensors")); !bytes.Equal(got, a2) {
		t.Error("model-a.safetensors of release 2 differs from the source's")
	}
}

// TestSyncOCIHostileModelFailsAndTagsNothing imports models whose tars hold
// links or climb out of the root, whose paths repeat or are absolute, and
// whose tar claims more bytes than its layer has: each import fails naming
// the problem, and the destination gets no tag.
func TestSyncOCIHostileModelFailsAndTagsNothing(t *testing.T) {
	syncEnv(t, nil)
	src := newDistribution(t)
	tg := target{name: "distribution", reg: src}
	short := mpTar(t, false, mpMember{name: "w", data: bytes.Repeat([]byte("x"), 4096)})
	short = short[:1024] // the header claims 4096 bytes; 512 follow it
	cases := []struct {
		name, mention string
		layers        []mpLayer
	}{
		{"traversal", "leaves the model's root", []mpLayer{{mpType("weight", "tar"), mpTar(t, false, mpMember{name: "../outside/keep", data: []byte("owned")}), "x"}}},
		{"raw traversal", "leaves the model's root", []mpLayer{{mpType("weight", "raw"), []byte("owned"), "../../x/outside/keep"}}},
		{"symlink", "is a link", []mpLayer{{mpType("weight", "tar"), mpTar(t, false, mpMember{name: "w", typ: '2', link: "../../outside"}), "w"}}},
		{"hard link", "is a link", []mpLayer{{mpType("weight", "tar+gzip"), mpTar(t, true, mpMember{name: "w", typ: '1', link: "/etc/passwd"}), "w"}}},
		{"duplicate", "is in layer 0 and layer 1", []mpLayer{{mpType("weight", "raw"), []byte("1"), "w"}, {mpType("doc", "raw"), []byte("2"), "./w"}}},
		{"absolute", "is absolute", []mpLayer{{mpType("doc", "raw"), []byte("1"), "/etc/passwd"}}},
		{"file under a file", "both a file and a directory", []mpLayer{{mpType("weight", "raw"), []byte("1"), "w"}, {mpType("doc", "raw"), []byte("2"), "w/x"}}},
		{"short tar", "past the end of its layer", []mpLayer{{mpType("weight", "tar"), short, "w"}}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst := newDistribution(t)
			m := newModel(t, nil, c.layers...)
			tag := "h" + string(rune('a'+i))
			m.push(t, tg, "mp/hostile", tag)
			res := run(t, "sync", "oci://"+src.Host+"/mp/hostile:"+tag, dst.Host+"/team/h:v1")
			if res.code != 1 || !strings.Contains(res.stderr, c.mention) {
				t.Fatalf("want exit 1 naming %q:\n%s", c.mention, res)
			}
			if tags := listTags(t, dst, "team/h"); len(tags) != 0 {
				t.Errorf("the destination has tags %v after a refused import", tags)
			}
		})
	}
}

// holdingProxy is a reverse proxy to a registry that holds every GET of
// one blob until released.
type holdingProxy struct {
	*httptest.Server
	mu     sync.Mutex
	digest string
	gate   chan struct{}
}

func newHoldingProxy(t *testing.T, reg *registry, digest string) *holdingProxy {
	u, _ := url.Parse(reg.URL)
	p := &holdingProxy{digest: digest, gate: make(chan struct{})}
	rp := httputil.NewSingleHostReverseProxy(u)
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+p.digest) {
			select {
			case <-p.gate:
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *holdingProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// TestSyncOCIKilledMidImportResumesThePinnedManifest starts a detached
// import whose second weight layer the source holds back, kills the job
// once the first is uploaded, moves the source tag to another release, and
// resumes the job: it imports the manifest the tag named when the job was
// created (pinned), uploading only what was missing.
func TestSyncOCIKilledMidImportResumesThePinnedManifest(t *testing.T) {
	syncEnv(t, nil)
	src := newDistribution(t)
	dst := newDistribution(t)
	fast, _ := mpSafetensors(2<<20, 2<<20, 2<<20, 2<<20)
	slow, starts := mpSafetensors(1<<20, 1<<20, 1<<20, 1<<20)
	for _, s := range starts {
		slow[s+50] = 0x77
	}
	files := map[string][]byte{"a.safetensors": fast, "zz.safetensors": slow}
	m := newModel(t, files,
		mpLayer{mpType("weight", "raw"), fast, "a.safetensors"},
		mpLayer{mpType("weight", "raw"), slow, "zz.safetensors"})
	m.push(t, target{name: "distribution", reg: src}, "mp/llm", "latest")
	proxy := newHoldingProxy(t, src, digestOf(slow))
	defer proxy.release()
	srcRef := "oci://" + strings.TrimPrefix(proxy.URL, "http://") + "/mp/llm:latest"
	repo := dst.Host + "/team/llm"

	id := mustRun(t, "sync", "--detach", srcRef, repo+":v1").lastLine()
	deadline := time.Now().Add(20 * time.Second)
	for dst.Stats().BlobBytesIn < int64(len(fast)) {
		if time.Now().After(deadline) {
			t.Fatalf("the job uploaded %d bytes, want %d; log:\n%s", dst.Stats().BlobBytesIn, len(fast), run(t, "jobs", "logs", id).stdout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	j := syncJobByID(t, id)
	if j.State != "RUNNING" || j.PID == 0 || j.Source != srcRef+"@"+m.digest {
		t.Fatalf("job before the kill: %+v, want RUNNING with its source pinned to %s", j, m.digest)
	}
	if err := syscall.Kill(j.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for syscall.Kill(j.PID, 0) == nil {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", j.PID)); err == nil && strings.Contains(string(b), ") Z") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if j := syncJobByID(t, id); j.State != "FAILED" {
		t.Fatalf("killed job: %+v", j)
	}
	if tags := listTags(t, dst, "team/llm"); len(tags) != 0 {
		t.Fatalf("tags %v before the job finished", tags)
	}

	// The source tag moves on; the job keeps its pin.
	other := newModel(t, map[string][]byte{"other.bin": []byte("other release")},
		mpLayer{mpType("weight", "raw"), []byte("other release"), "other.bin"})
	other.push(t, target{name: "distribution", reg: src}, "mp/llm", "latest")

	proxy.release()
	dst.ResetStats()
	mustRun(t, "jobs", "resume", id)
	ref := mustRun(t, "jobs", "wait", id).lastLine()
	in := dst.Stats().BlobBytesIn
	t.Logf("resumed job uploaded %d blob bytes; the held file is %d bytes, the model %d", in, len(slow), len(fast)+len(slow))
	if in < int64(len(slow)) || in > int64(len(slow))+64<<10 {
		t.Errorf("the resumed job uploaded %d blob bytes; want the missing %d (plus metadata)", in, len(slow))
	}
	dir := filepath.Join(t.TempDir(), "out")
	mustRun(t, "pull", ref, dir)
	checkModelTree(t, dir, m)
	_, d, _ := strings.Cut(ref, "@")
	if ann := rootAnnotations(t, dst, "team/llm", d); ann["io.bdnvol.source.revision"] != m.digest {
		t.Errorf("annotations %v: want the pinned revision %s", ann, m.digest)
	}
}

// TestModelPackDirectoryTar: a tar layer made from a directory, as GNU tar
// and modctl write it ("./", "./scripts/", then the files), with a 0664
// README and a 0775 script: pull and sync both give every file with its
// mode, and verify passes. (Before, the reader stopped at the first
// directory and refused "./".)
func TestModelPackDirectoryTar(t *testing.T) {
	syncEnv(t, nil)
	reg := newDistribution(t)
	files := map[string][]byte{"README.md": []byte("# m\n"), "scripts/convert.sh": []byte("#!/bin/sh\n"), "weights/w.bin": randBytes(3, 300<<10)}
	modes := map[string]os.FileMode{"README.md": 0o664, "scripts/convert.sh": 0o775, "weights/w.bin": 0o644}
	m := newModel(t, files,
		mpLayer{mpType("code", "tar"), mpTar(t, false,
			mpMember{name: "./", typ: tar.TypeDir, mode: 0o755},
			mpMember{name: "./README.md", data: files["README.md"], mode: 0o664},
			mpMember{name: "./scripts/", typ: tar.TypeDir, mode: 0o775},
			mpMember{name: "./scripts/convert.sh", data: files["scripts/convert.sh"], mode: 0o775},
			mpMember{name: "./weights/", typ: tar.TypeDir, mode: 0o755},
			mpMember{name: "./weights/w.bin", data: files["weights/w.bin"]},
		), "."})
	m.push(t, target{name: "distribution", reg: reg}, "mp/dirs", "v1")
	synced := syncOCI(t, "oci://"+reg.Host+"/mp/dirs:v1", reg.Host+"/team/dirs:v1")
	for name, ref := range map[string]string{"pull": reg.Host + "/mp/dirs:v1", "sync": synced.Reference} {
		dir := filepath.Join(t.TempDir(), name)
		mustRun(t, "pull", ref, dir)
		for p, want := range files {
			fi, err := os.Stat(filepath.Join(dir, p))
			if err != nil {
				t.Errorf("%s: %s missing: %v", name, p, err)
				continue
			}
			if got := fileContents(t, filepath.Join(dir, p)); !bytes.Equal(got, want) || fi.Mode().Perm() != modes[p] {
				t.Errorf("%s: %s: %d bytes, mode %v; want %d bytes, mode %v", name, p, len(got), fi.Mode().Perm(), len(want), modes[p])
			}
		}
		mustRun(t, "verify", ref, dir)
	}
}
