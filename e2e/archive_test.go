package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ggcrv1 "github.com/google/go-containerregistry/pkg/v1"
	ggcrlayout "github.com/google/go-containerregistry/pkg/v1/layout"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// archiveMembers lists an archive's members and their sizes.
func archiveMembers(t *testing.T, path string) map[string]int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int64{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out[h.Name] = h.Size
	}
}

// TestCopyArchiveSince carries a fine-tune into an "air-gapped" site: a full
// archive of v1, then `copy --since v1` of v2 into a second archive that holds
// only what v1 lacks. Both import into an empty layout and into a registry
// (v1 first), the digests are the source's and pulls are bit-identical; the
// --since archive alone into an empty layout fails, naming what is missing,
// with nothing tagged. The archive is a plain OCI layout once extracted.
func TestCopyArchiveSince(t *testing.T) {
	bin(t)
	v1, v2 := fineTunePair(t, 16<<20)
	src := newDistribution(t)
	d1 := pushJSON(t, src.Host+"/model:v1", v1).Digest
	d2 := pushJSON(t, src.Host+"/model:v2", v2).Digest
	b1, b2 := versionBlobs(t, src, "model", d1), versionBlobs(t, src, "model", d2)
	dir := t.TempDir()
	full, since := filepath.Join(dir, "v1.tar"), filepath.Join(dir, "v2-since-v1.tar")

	r1 := copyJSON(t, src.Host+"/model:v1", "oci-archive:"+full)
	r2 := copyJSON(t, "--since", src.Host+"/model:v1", src.Host+"/model:v2", "oci-archive:"+since)
	if r1.Digest != d1 || r2.Digest != d2 {
		t.Fatalf("archive digests %s %s, want %s %s", r1.Digest, r2.Digest, d1, d2)
	}
	fi1, _ := os.Stat(full)
	fi2, _ := os.Stat(since)
	changed := sumBlobs(b2, b1)
	t.Logf("archives: v1 whole %d bytes (blobs %d); v2 --since v1 %d bytes for %d bytes of blobs v1 lacks (%.3fx), v2 whole would be %d",
		fi1.Size(), sumBlobs(b1, nil), fi2.Size(), changed, float64(fi2.Size())/float64(changed), sumBlobs(b2, nil))
	if fi2.Size() > changed*105/100+64<<10 {
		t.Errorf("the --since archive is %d bytes for %d bytes of new blobs", fi2.Size(), changed)
	}
	members := archiveMembers(t, since)
	for d := range b1 {
		if _, inV2 := b2[d]; inV2 {
			if _, ok := members["blobs/sha256/"+strings.TrimPrefix(d, "sha256:")]; ok {
				t.Errorf("the --since archive holds %s, which v1 has", d)
			}
		}
	}
	if _, err := os.Stat(since + ".partial"); !os.IsNotExist(err) {
		t.Errorf("a .partial file is left: %v", err)
	}
	names := []string{}
	for n := range archiveMembers(t, full) {
		names = append(names, n)
	}
	for _, want := range []string{"oci-layout", "index.json"} {
		if _, ok := archiveMembers(t, full)[want]; !ok {
			t.Errorf("the archive has no %s: %v", want, names)
		}
	}

	// The --since archive alone: refused, nothing tagged.
	lone := "oci:" + filepath.Join(t.TempDir(), "lone")
	res := run(t, "copy", "oci-archive:"+since, lone)
	t.Logf("the --since archive alone: %s", strings.TrimSpace(res.stderr))
	if res.code == 0 || !strings.Contains(res.stderr, "--since") {
		t.Errorf("the --since archive into an empty layout:\n%s", res)
	}
	if r := run(t, "resolve", lone+":v2"); r.code == 0 {
		t.Errorf("v2 was tagged in the layout although its blobs are missing:\n%s", r)
	}

	// Into an empty layout and into a registry: v1, then v2.
	lay := "oci:" + filepath.Join(t.TempDir(), "site")
	reg := newGGCR(t)
	for _, dst := range []string{lay, reg.Host + "/model"} {
		r1 := copyJSON(t, "oci-archive:"+full, dst)
		r2 := copyJSON(t, "oci-archive:"+since, dst)
		if r2.BytesSent != changed {
			t.Errorf("import of the --since archive into %s sent %d bytes, want %d", dst, r2.BytesSent, changed)
		}
		t.Logf("import into %s: v1 sent %d bytes, v2 sent %d (%d skipped, there already)", dst, r1.BytesSent, r2.BytesSent, r2.BytesSkipped)
		for tag, want := range map[string]string{"v1": d1, "v2": d2} {
			if got := strings.TrimSpace(mustRun(t, "resolve", dst+":"+tag).stdout); !strings.HasSuffix(got, "@"+want) {
				t.Errorf("%s:%s resolves to %s, want %s", dst, tag, got, want)
			}
		}
		out := filepath.Join(t.TempDir(), "out")
		pull(t, dst+":v2", out)
		compareTrees(t, v2, out)
	}

	// Extracted, the archive is an OCI layout.
	ext := filepath.Join(t.TempDir(), "extracted")
	os.MkdirAll(ext, 0o755)
	untar(t, full, ext)
	out := filepath.Join(t.TempDir(), "out-ext")
	pull(t, "oci:"+ext+":v1", out)
	compareTrees(t, v1, out)
	checkLayoutByGGCR(t, ext, "v1", d1)

	// Written as it streamed: nothing was staged beside the archives.
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("the archives' directory holds %v, want the two archives only", names)
	}
}

// checkLayoutByGGCR reads the layout in dir with go-containerregistry's
// layout package, as crane does: tag names the manifest want, and every
// blob it lists is there with its size.
func checkLayoutByGGCR(t *testing.T, dir, tag, want string) {
	t.Helper()
	p, err := ggcrlayout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range im.Manifests {
		if d.Annotations[ocispec.AnnotationRefName] != tag {
			continue
		}
		if d.Digest.String() != want {
			t.Fatalf("go-containerregistry: %s is %s, want %s", tag, d.Digest, want)
		}
		b, err := p.Bytes(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		var m ocispec.Manifest
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for _, l := range append([]ocispec.Descriptor{m.Config}, m.Layers...) {
			h, err := ggcrv1.NewHash(l.Digest.String())
			if err != nil {
				t.Fatal(err)
			}
			rc, err := p.Blob(h)
			if err != nil {
				t.Fatalf("go-containerregistry: blob %s: %v", l.Digest, err)
			}
			n, _ := io.Copy(io.Discard, rc)
			rc.Close()
			if n != l.Size {
				t.Errorf("go-containerregistry: blob %s has %d bytes, want %d", l.Digest, n, l.Size)
			}
		}
		return
	}
	t.Fatalf("go-containerregistry: no manifest tagged %s in %s", tag, dir)
}

func untar(t *testing.T, file, dir string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			os.MkdirAll(p, 0o755)
			continue
		}
		os.MkdirAll(filepath.Dir(p), 0o755)
		b, _ := io.ReadAll(tr)
		os.WriteFile(p, b, 0o644)
	}
}

// rewriteArchive copies archive src to dst, passing each member through
// edit (which may change its header and bytes, or add members).
func rewriteArchive(t *testing.T, src, dst string, edit func(h *tar.Header, b []byte, tw *tar.Writer) (*tar.Header, []byte)) {
	t.Helper()
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		h, b = edit(h, b, tw)
		if h == nil {
			continue
		}
		h.Size = int64(len(b))
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
			b = nil
		}
		tw.WriteHeader(h)
		tw.Write(b)
	}
	tw.Close()
	if err := os.WriteFile(dst, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A corrupted chunk member, a path escaping the layout, a symlink and a
// member that is not a layout's are each refused before anything is
// tagged, and nothing is written outside the destination; the corrupted
// archive sends nothing to a registry either.
func TestCopyArchiveRefusesBadMembers(t *testing.T) {
	bin(t)
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "w.bin"), bytes.Repeat([]byte("weights "), 100000), 0o644)
	lay := "oci:" + filepath.Join(t.TempDir(), "src")
	mustRun(t, "push", lay+":v1", src)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.tar")
	copyJSON(t, lay+":v1", "oci-archive:"+good)

	firstBlob := ""
	for n, size := range archiveMembers(t, good) {
		if strings.HasPrefix(n, "blobs/sha256/") && size > 100000 && firstBlob == "" {
			firstBlob = n
		}
	}
	if firstBlob == "" {
		t.Fatal("no chunk blob in the archive")
	}
	victim := filepath.Join(dir, "victim")
	cases := map[string]func(h *tar.Header, b []byte, tw *tar.Writer) (*tar.Header, []byte){
		"corrupt chunk": func(h *tar.Header, b []byte, _ *tar.Writer) (*tar.Header, []byte) {
			if h.Name == firstBlob {
				b = append([]byte{}, b...)
				b[len(b)/2] ^= 1
			}
			return h, b
		},
		"path escape": func(h *tar.Header, b []byte, _ *tar.Writer) (*tar.Header, []byte) {
			if h.Name == "oci-layout" {
				h.Name = "../../" + filepath.Base(dir) + "/victim"
			}
			return h, b
		},
		"symlink": func(h *tar.Header, b []byte, _ *tar.Writer) (*tar.Header, []byte) {
			if h.Name == firstBlob {
				return &tar.Header{Name: h.Name, Typeflag: tar.TypeSymlink, Linkname: victim}, nil
			}
			return h, b
		},
		"stray member": func(h *tar.Header, b []byte, _ *tar.Writer) (*tar.Header, []byte) {
			if h.Name == "index.json" {
				h.Name = "blobs/../index.json"
			}
			return h, b
		},
	}
	for name, edit := range cases {
		t.Run(name, func(t *testing.T) {
			bad := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".tar")
			rewriteArchive(t, good, bad, edit)
			dst := "oci:" + filepath.Join(t.TempDir(), "dst")
			res := run(t, "copy", "oci-archive:"+bad, dst)
			if res.code == 0 || !strings.Contains(res.stderr, "not a valid oci-archive") {
				t.Errorf("copy from the %s archive:\n%s", name, res)
			}
			if r := run(t, "resolve", dst+":v1"); r.code == 0 {
				t.Errorf("%s: v1 was tagged at the destination", name)
			}
			if _, err := os.Lstat(victim); err == nil {
				t.Errorf("%s: the archive wrote %s", name, victim)
			}
		})
	}
	// Into a registry: refused before any blob or tag is sent.
	bad := filepath.Join(dir, "corrupt-chunk.tar")
	reg := newDistribution(t)
	reg.ResetStats()
	res := run(t, "copy", "oci-archive:"+bad, reg.Host+"/site/model")
	if st := reg.Stats(); res.code == 0 || !strings.Contains(res.stderr, "not a valid oci-archive") || st.BlobBytesIn != 0 {
		t.Errorf("copy of the corrupt archive into a registry (%d blob bytes received):\n%s", st.BlobBytesIn, res)
	}
	if tags := listTags(t, reg, "site/model"); len(tags) != 0 {
		t.Errorf("the corrupt archive tagged %v in the registry", tags)
	}
}
