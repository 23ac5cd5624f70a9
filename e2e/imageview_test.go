package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	godigest "github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/e2e/synth"
)

// exportedImage is the JSON object `bdnvol export-image --json` prints.
type exportedImage struct {
	Image         string  `json:"image"`
	Digest        string  `json:"digest"`
	Attached      string  `json:"attached"`
	Volume        string  `json:"volume"`
	VolumeBytes   int64   `json:"volume_bytes"`
	ImageBytes    int64   `json:"image_bytes"`
	BytesUploaded int64   `json:"bytes_uploaded"`
	Seconds       float64 `json:"seconds"`
	Layers        []struct {
		Digest   string `json:"digest"`
		Size     int64  `json:"size"`
		Files    int    `json:"files"`
		Bytes    int64  `json:"bytes"`
		Uploaded bool   `json:"uploaded"`
	} `json:"layers"`
}

func exportImage(t *testing.T, env []string, args ...string) exportedImage {
	t.Helper()
	var res result
	if env != nil {
		res = runEnv(t, env, append([]string{"export-image", "--json"}, args...)...)
	} else {
		res = run(t, append([]string{"export-image", "--json"}, args...)...)
	}
	if res.code != 0 {
		t.Fatalf("export-image failed:\n%s", res)
	}
	var e exportedImage
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.stdout)), &e); err != nil || !strings.HasPrefix(e.Digest, "sha256:") {
		t.Fatalf("export-image --json: want one JSON object (%v):\n%s", err, res)
	}
	return e
}

// runEnv is run with extra environment variables.
func runEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	return run(t, args...)
}

// imageViewSource writes a synthetic checkpoint with a few extra entries:
// a nested directory with a private file, a symlink, an empty file and a
// small file that is not prioritised.
func imageViewSource(t *testing.T, dir string, target int64) {
	t.Helper()
	if err := synth.Generate(dir, synth.Options{TargetBytes: target, Shards: 4, Seed: 16}); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "extra/deep"), 0o750))
	must(os.WriteFile(filepath.Join(dir, "extra/deep/secret.txt"), []byte("private\n"), 0o600))
	must(os.WriteFile(filepath.Join(dir, "extra/empty"), nil, 0o644))
	must(os.WriteFile(filepath.Join(dir, "README.md"), []byte("# synthetic\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Symlink("../config.json", filepath.Join(dir, "extra/config-link")))
}

// pulledImage fetches the image view with go-containerregistry.
func pulledImage(t *testing.T, tg target, repo, dgst string) v1.Image {
	t.Helper()
	if tg.reg == nil {
		p, err := layout.FromPath(filepath.Join(tg.root, repo))
		if err != nil {
			t.Fatal(err)
		}
		h, err := v1.NewHash(dgst)
		if err != nil {
			t.Fatal(err)
		}
		img, err := p.Image(h)
		if err != nil {
			t.Fatalf("image %s in the layout: %v", dgst, err)
		}
		return img
	}
	ref, err := name.NewDigest(tg.reg.Host+"/"+repo+"@"+dgst, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	return img
}

type viewEntry struct {
	mode   fs.FileMode
	data   string // file content or symlink target
	isLink bool
}

// dirTree reads a directory tree: path → type, permission bits and content.
func viewDirTree(t *testing.T, root string) map[string]viewEntry {
	t.Helper()
	out := map[string]viewEntry{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		e := viewEntry{mode: fi.Mode() & (fs.ModeType | fs.ModePerm)}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			e.isLink = true
			e.data, err = os.Readlink(p)
		case fi.Mode().IsRegular():
			var b []byte
			b, err = os.ReadFile(p)
			e.data = string(b)
		}
		out[filepath.ToSlash(rel)] = e
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// imageTree flattens the image with mutate.Extract and reads what lies
// under root.
func viewImageTree(t *testing.T, img v1.Image, root string) map[string]viewEntry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := map[string]viewEntry{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		rel, ok := strings.CutPrefix(name, root+"/")
		if !ok {
			continue
		}
		if h.Uid != 0 || h.Gid != 0 || h.ModTime.Unix() != 0 {
			t.Errorf("%s: uid %d gid %d mtime %v: want 0, 0, the epoch", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		e := viewEntry{mode: fs.FileMode(h.Mode) & fs.ModePerm}
		switch h.Typeflag {
		case tar.TypeDir:
			e.mode |= fs.ModeDir
		case tar.TypeSymlink:
			e.mode, e.isLink, e.data = fs.ModeSymlink|fs.FileMode(h.Mode)&fs.ModePerm, true, h.Linkname
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			e.data = string(b)
		default:
			t.Errorf("%s: tar type %c", h.Name, h.Typeflag)
		}
		out[rel] = e
	}
	return out
}

func compareImageTree(t *testing.T, want, got map[string]viewEntry) {
	t.Helper()
	for p, w := range want {
		g, ok := got[p]
		switch {
		case !ok:
			t.Errorf("%s: missing from the image", p)
		case w.isLink != g.isLink || w.data != g.data:
			t.Errorf("%s: content or link target differs (link %v/%v, %d/%d bytes)", p, w.isLink, g.isLink, len(w.data), len(g.data))
		case w.mode&^fs.ModeSymlink != g.mode&^fs.ModeSymlink && !w.isLink:
			t.Errorf("%s: mode %v in the image, %v in the source", p, g.mode, w.mode)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: in the image, not in the source", p)
		}
	}
}

// checkLayers opens every layer with estargz, verifies its TOC digest and
// every chunk of every file against the TOC, and checks that the first
// layer lists the prioritised files (config.json, tokenizer, JSON) before
// its prefetch landmark and the other small files after it.
func checkLayers(t *testing.T, img v1.Image, root string) {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		r, err := estargz.Open(io.NewSectionReader(bytes.NewReader(b), 0, int64(len(b))))
		if err != nil {
			t.Fatalf("layer %d: estargz.Open: %v", i+1, err)
		}
		tocDigest := m.Layers[i].Annotations["containerd.io/snapshot/stargz/toc.digest"]
		td, err := godigest.Parse(tocDigest)
		if err != nil {
			t.Fatalf("layer %d: toc digest annotation %q: %v", i+1, tocDigest, err)
		}
		v, err := r.VerifyTOC(td)
		if err != nil {
			t.Fatalf("layer %d: VerifyTOC: %v", i+1, err)
		}
		// Walk the layer's tar (its uncompressed form) in order and verify
		// each regular file's chunks through the TOC.
		urc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(urc)
		var order []string
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			name := strings.TrimSuffix(h.Name, "/")
			order = append(order, name)
			if h.Typeflag != tar.TypeReg || name == estargz.TOCTarName || h.Size == 0 {
				continue
			}
			for off := int64(0); off < h.Size; {
				ce, ok := r.ChunkEntryForOffset(name, off)
				if !ok {
					t.Fatalf("layer %d: %s: no TOC chunk at %d", i+1, name, off)
				}
				cv, err := v.Verifier(ce)
				if err != nil {
					t.Fatalf("layer %d: %s: %v", i+1, name, err)
				}
				sr, err := r.OpenFile(name)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.Copy(cv, io.NewSectionReader(sr, ce.ChunkOffset, ce.ChunkSize)); err != nil {
					t.Fatal(err)
				}
				if !cv.Verified() {
					t.Fatalf("layer %d: %s: chunk at %d fails TOC verification", i+1, name, ce.ChunkOffset)
				}
				off = ce.ChunkOffset + ce.ChunkSize
			}
		}
		urc.Close()
		if i > 0 {
			if !slices.Contains(order, estargz.NoPrefetchLandmark) {
				t.Errorf("layer %d: no %s: %v", i+1, estargz.NoPrefetchLandmark, order)
			}
			continue
		}
		lm := slices.Index(order, estargz.PrefetchLandmark)
		if lm < 0 {
			t.Fatalf("layer 1 has no prefetch landmark: %v", order)
		}
		for _, p := range []string{"config.json", "tokenizer.json", synth.IndexName} {
			if j := slices.Index(order, root+"/"+p); j < 0 || j > lm {
				t.Errorf("layer 1: %s at %d, landmark at %d: want it prioritised: %v", p, j, lm, order)
			}
		}
		if j := slices.Index(order, root+"/config.json"); j != 0 && order[0] != root {
			// Parent directories may precede it; nothing else may.
			for _, n := range order[:j] {
				if n != root {
					t.Errorf("layer 1: %s before config.json", n)
				}
			}
		}
		for _, p := range []string{"README.md", "extra/deep/secret.txt"} {
			if j := slices.Index(order, root+"/"+p); j < lm {
				t.Errorf("layer 1: %s at %d, landmark at %d: want it after the landmark", p, j, lm)
			}
		}
	}
}

func manifestStatus(t *testing.T, reg *registry, repo, dgst string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodHead, reg.URL+"/v2/"+repo+"/manifests/"+dgst, nil)
	req.Header.Set("Accept", manifestAccepts)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestImageView exports a version as an eStargz image and checks the tree,
// the layers, determinism, what a fine-tune re-uploads, that inspect lists
// the image as a referrer of the version, and that gc --apply deletes it
// with the version.
func TestImageView(t *testing.T) {
	forKinds(t, []string{"distribution", "ggcr", "ggcr-referrers", "oci-layout"}, func(t *testing.T, tg target) {
		src := filepath.Join(t.TempDir(), "src")
		imageViewSource(t, src, 24<<20)
		repo := tg.repo("team/llama")
		mustRun(t, "push", repo+":v1", src)

		const layerSize = "8MiB"
		e1 := exportImage(t, nil, "--layer-size", layerSize, repo+":v1")
		if e1.Attached != e1.Image || !strings.HasSuffix(e1.Image, "@"+e1.Digest) {
			t.Errorf("image %s attached %s: want both in the volume's repository", e1.Image, e1.Attached)
		}
		img := pulledImage(t, tg, "team/llama", e1.Digest)
		compareImageTree(t, viewDirTree(t, src), viewImageTree(t, img, "models"))
		checkLayers(t, img, "models")
		// Layers: the first holds the small files; the others at most
		// 8 MiB of content unless a single file.
		if len(e1.Layers) < 3 {
			t.Errorf("%d layers for 4 shards of ~6 MiB at an 8 MiB bound", len(e1.Layers))
		}
		for i, l := range e1.Layers[1:] {
			if l.Bytes > 8<<20 && l.Files > 1 {
				t.Errorf("layer %d: %d files, %d bytes: over the bound", i+2, l.Files, l.Bytes)
			}
		}
		m, err := img.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		vd := e1.Volume[strings.LastIndex(e1.Volume, "@")+1:]
		if m.Annotations["io.bdnvol.volume.digest"] != vd || cfg.Config.Labels["io.bdnvol.volume.digest"] != vd {
			t.Errorf("annotation %q, label %q: want %s", m.Annotations["io.bdnvol.volume.digest"], cfg.Config.Labels["io.bdnvol.volume.digest"], vd)
		}
		if m.Subject == nil || m.Subject.Digest.String() != vd {
			t.Errorf("subject %v: want %s", m.Subject, vd)
		}

		// Another day, another machine's settings, another repository: the
		// same digest.
		other := tg.repo("mirror/llama-image")
		e2 := exportImage(t, []string{"TZ=Pacific/Kiritimati", "SOURCE_DATE_EPOCH=1900000000", "LANG=C"},
			"--layer-size", layerSize, repo+"@"+vd, other+":prod")
		if e2.Digest != e1.Digest {
			t.Fatalf("two builds of %s: %s and %s", vd, e1.Digest, e2.Digest)
		}
		if e2.Image != other+":prod@"+e1.Digest || e2.Attached != repo+"@"+e1.Digest {
			t.Errorf("image %s attached %s", e2.Image, e2.Attached)
		}

		// A fine-tune that rewrites one shard: only that shard's layer is
		// uploaded again.
		ft := filepath.Join(t.TempDir(), "ft")
		if out, err := exec.Command("cp", "-a", src, ft).CombinedOutput(); err != nil {
			t.Fatalf("cp -a: %v\n%s", err, out)
		}
		shards, _ := filepath.Glob(filepath.Join(ft, "*.safetensors"))
		slices.Sort(shards)
		if len(shards) < 3 {
			t.Fatalf("shards: %v", shards)
		}
		b, err := os.ReadFile(shards[1])
		if err != nil {
			t.Fatal(err)
		}
		for i := len(b) / 2; i < len(b)/2+4096; i++ {
			b[i] ^= 0x5a
		}
		if err := os.WriteFile(shards[1], b, 0o644); err != nil {
			t.Fatal(err)
		}
		mustRun(t, "push", repo+":v2", ft)
		if tg.reg != nil {
			tg.reg.ResetStats()
		}
		e3 := exportImage(t, nil, "--layer-size", layerSize, repo+":v2")
		old := map[string]bool{}
		for _, l := range e1.Layers {
			old[l.Digest] = true
		}
		var changed, changedBytes int64
		for _, l := range e3.Layers {
			if !old[l.Digest] {
				changed++
				changedBytes += l.Size
				if !l.Uploaded {
					t.Errorf("new layer %s not uploaded", l.Digest)
				}
			} else if l.Uploaded {
				t.Errorf("unchanged layer %s uploaded again", l.Digest)
			}
		}
		if changed != 1 {
			t.Errorf("fine-tune of one shard changed %d layers: want 1", changed)
		}
		if tg.reg != nil {
			in := tg.reg.Stats().BlobBytesIn
			t.Logf("fine-tune rebuild: %d of %d image bytes uploaded (one layer of %d)", in, e3.ImageBytes, changedBytes)
			if in < changedBytes || in > changedBytes+64<<10 {
				t.Errorf("fine-tune rebuild uploaded %d bytes: want the changed layer's %d plus the config", in, changedBytes)
			}
		}

		// lint --all: an image view of v1 next to the volume pinned at v2 is
		// out of step; the view of v2 is not.
		v2d := e3.Volume[strings.LastIndex(e3.Volume, "@")+1:]
		pod := func(view string) string {
			f := filepath.Join(t.TempDir(), "pod.yaml")
			y := "apiVersion: v1\nkind: Pod\nmetadata: {name: llama}\nspec:\n  containers: []\n  volumes:\n" +
				"    - name: weights\n      csi:\n        driver: csi.bdnvol.dev\n        volumeAttributes:\n          ref: " + repo + ":v2@" + v2d + "\n" +
				"    - name: weights-image\n      image:\n        reference: " + view + "\n"
			if err := os.WriteFile(f, []byte(y), 0o644); err != nil {
				t.Fatal(err)
			}
			return f
		}
		if res := run(t, "lint", "--all", pod(e2.Image)); res.code != 1 || !strings.Contains(res.stdout+res.stderr, "image view of "+repo+"@"+vd) {
			t.Errorf("lint of a view of v1 next to v2: want exit 1 naming the mismatch:\n%s", res)
		}
		if res := run(t, "lint", "--all", pod(e3.Image)); res.code != 0 {
			t.Errorf("lint of the view of v2 next to v2: want exit 0:\n%s", res)
		}

		// inspect lists the image views; gc --apply deletes them with their
		// versions.
		var insp struct {
			Images []string `json:"images"`
		}
		mustJSON(t, []byte(mustRun(t, "inspect", "--json", repo+":v1").stdout), &insp)
		if !slices.Equal(insp.Images, []string{repo + "@" + e1.Digest}) {
			t.Errorf("inspect v1: images %v: want [%s]", insp.Images, repo+"@"+e1.Digest)
		}
		if tg.name == "ggcr-referrers" {
			// A registry with the referrers API lists the view there, and
			// gets no fallback tag.
			if got := listReferrers(t, tg.reg, "team/llama", vd, ""); !slices.Contains(got, e1.Digest) {
				t.Errorf("referrers API of v1: %v, want the image view %s", got, e1.Digest)
			}
			if fb := "sha256-" + strings.TrimPrefix(vd, "sha256:"); slices.Contains(listTags(t, tg.reg, "team/llama"), fb) {
				t.Errorf("a registry serving referrers got the fallback tag %s", fb)
			}
		}
		text := mustRun(t, "inspect", repo+":v2").stdout
		if !strings.Contains(text, "image:     "+repo+"@"+e3.Digest) {
			t.Errorf("inspect v2 does not list its image view:\n%s", text)
		}
		mustRun(t, "gc", repo, "--keep-last", "1", "--keep-tag", "", "--apply")
		mustJSON(t, []byte(mustRun(t, "inspect", "--json", repo+":v2").stdout), &insp)
		if !slices.Equal(insp.Images, []string{repo + "@" + e3.Digest}) {
			t.Errorf("inspect v2 after gc: images %v: want [%s]", insp.Images, repo+"@"+e3.Digest)
		}
		if tg.reg != nil {
			if s := manifestStatus(t, tg.reg, "team/llama", e1.Digest); s != http.StatusNotFound {
				t.Errorf("image view of the deleted version: HEAD %d, want 404", s)
			}
			if s := manifestStatus(t, tg.reg, "team/llama", e3.Digest); s != http.StatusOK {
				t.Errorf("image view of the kept version: HEAD %d, want 200", s)
			}
			// The copy in the other repository is the user's: untouched.
			if s := manifestStatus(t, tg.reg, "mirror/llama-image", e1.Digest); s != http.StatusOK {
				t.Errorf("image in the other repository: HEAD %d, want 200", s)
			}
			tags := listTags(t, tg.reg, "team/llama")
			t.Logf("%s: tags after gc: %v", tg.name, tags)
			// go-containerregistry's registry keeps a tag when the manifest it
			// names is deleted by digest, so only distribution drops it.
			if fb := "sha256-" + strings.TrimPrefix(vd, "sha256:"); tg.name == "distribution" && slices.Contains(tags, fb) {
				t.Errorf("referrers fallback tag %s of the deleted version is left behind", fb)
			}
		} else {
			res := run(t, "inspect", repo+"@"+e1.Digest)
			if res.code == 0 {
				t.Errorf("image view of the deleted version still in the layout:\n%s", res)
			}
		}
		// rm deletes the last one with its version.
		mustRun(t, "rm", repo+":v2")
		if tg.reg != nil {
			if s := manifestStatus(t, tg.reg, "team/llama", e3.Digest); s != http.StatusNotFound {
				t.Errorf("image view after rm: HEAD %d, want 404", s)
			}
		}
	})
}

// TestImageViewRefusesWhiteoutNames: a version holding a name that starts
// with ".wh." (a whiteout to a container runtime, which would hide files of
// the mounted image) is refused by export-image with an error naming the
// file, and nothing is uploaded.
func TestImageViewRefusesWhiteoutNames(t *testing.T) {
	forKinds(t, []string{"distribution", "oci-layout"}, func(t *testing.T, tg target) {
		src := filepath.Join(t.TempDir(), "src")
		if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		for name, body := range map[string]string{"config.json": "{}\n", "model.bin": "weights\n", "sub/.wh.model.bin": "hides ../model.bin\n"} {
			if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		repo := tg.repo("team/wh")
		mustRun(t, "push", repo+":v1", src)
		if tg.reg != nil {
			tg.reg.ResetStats()
		}
		other := tg.repo("team/wh-image")
		res := run(t, "export-image", repo+":v1", other+":latest")
		if res.code == 0 || !strings.Contains(res.stderr, `"sub/.wh.model.bin"`) || !strings.Contains(res.stderr, ".wh.") {
			t.Fatalf("export-image of a version holding sub/.wh.model.bin: want an error naming it:\n%s", res)
		}
		if tg.reg != nil {
			st := tg.reg.Stats()
			if st.BlobBytesIn != 0 || st.Requests["PUT manifest"] != 0 || st.Requests["POST upload"] != 0 {
				t.Errorf("a refused export uploaded: %d blob bytes, requests %v", st.BlobBytesIn, st.Requests)
			}
		} else if blobs, _ := os.ReadDir(filepath.Join(tg.root, "team/wh-image", "blobs", "sha256")); len(blobs) != 0 {
			t.Errorf("a refused export wrote %d blobs", len(blobs))
		}
	})
}
