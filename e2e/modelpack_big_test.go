package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// sparseSafetensors is a large safetensors file that is mostly zeros,
// generated on the fly: U8 tensors, each either all zeros or filled with
// a pattern of its offset. Nothing of it is held in memory but the header.
type sparseSafetensors struct {
	hdr     []byte
	tensors []sparseTensor
	size    int64
}

type sparseTensor struct {
	begin, end int64 // in the file
	zero       bool
}

// newSparseSafetensors lays out tensors of the given sizes, those whose
// index is in data filled, the others zeros.
func newSparseSafetensors(sizes []int64, data map[int]bool) *sparseSafetensors {
	meta := map[string]any{}
	var off int64
	for i, n := range sizes {
		meta[fmt.Sprintf("t%03d", i)] = map[string]any{"dtype": "U8", "shape": []int64{n}, "data_offsets": []int64{off, off + n}}
		off += n
	}
	h, _ := json.Marshal(meta)
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	s := &sparseSafetensors{hdr: binary.LittleEndian.AppendUint64(nil, uint64(len(h)))}
	s.hdr = append(s.hdr, h...)
	pos := int64(len(s.hdr))
	for i, n := range sizes {
		s.tensors = append(s.tensors, sparseTensor{pos, pos + n, !data[i]})
		pos += n
	}
	s.size = pos
	return s
}

// ReadAt fills p with the file's bytes at off.
func (s *sparseSafetensors) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) && off < s.size {
		if off < int64(len(s.hdr)) {
			k := copy(p[n:], s.hdr[off:])
			n, off = n+k, off+int64(k)
			continue
		}
		for _, t := range s.tensors {
			if off < t.begin || off >= t.end {
				continue
			}
			q := p[n:min(len(p), n+int(t.end-off))]
			if t.zero {
				clear(q)
			} else {
				for i := range q {
					o := off + int64(i)
					q[i] = byte(o*131 + o>>9 + o>>17)
				}
			}
			n, off = n+len(q), off+int64(len(q))
			break
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// uploadBlobStream uploads what r gives as one blob with a streamed PATCH
// (the digest computed on the way) and returns its digest and size.
func uploadBlobStream(t testing.TB, reg *registry, repo string, r io.Reader) (string, int64) {
	t.Helper()
	resp, err := http.Post(reg.URL+"/v2/"+repo+"/blobs/uploads/", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, err := resp.Location()
	if resp.StatusCode != http.StatusAccepted || err != nil {
		t.Fatalf("POST blob upload to %s: %s (%v)", repo, resp.Status, err)
	}
	h := sha256.New()
	cr := &countingReader{r: io.TeeReader(r, h)}
	req, err := http.NewRequest(http.MethodPatch, loc.String(), cr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("PATCH blob upload: %s", resp.Status)
	}
	if loc, err = resp.Location(); err != nil {
		t.Fatal(err)
	}
	d := "sha256:" + hex.EncodeToString(h.Sum(nil))
	q := loc.Query()
	q.Set("digest", d)
	loc.RawQuery = q.Encode()
	req, _ = http.NewRequest(http.MethodPut, loc.String(), nil)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT blob %s: %s %s", d, resp.Status, body)
	}
	return d, cr.n
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// TestModelPackSparse5GB stores a ModelPack model whose weights are one
// 5 GiB raw safetensors layer, mostly zeros with three filled tensors,
// streamed to a registry without writing 5 GiB anywhere but the registry.
// A mount reads the filled tensor in the middle with at most three
// registry requests and 1.1x its bytes after the open; a pull writes the
// file byte for byte (its SHA-256 is the layer's digest). Times, requests
// and the CLI's peak memory are logged.
func TestModelPackSparse5GB(t *testing.T) {
	requireFUSE(t)
	start := time.Now()
	reg := newDistribution(t)
	const mib = 1 << 20
	sizes := []int64{2048 * mib, 16 * mib, 464 * mib, 32 * mib, 2048 * mib, 16 * mib, 496 * mib}
	const mid = 3
	sp := newSparseSafetensors(sizes, map[int]bool{1: true, mid: true, 5: true})
	w, n := uploadBlobStream(t, reg, "mp/sparse", io.NewSectionReader(sp, 0, sp.size))
	if n != sp.size {
		t.Fatalf("uploaded %d bytes of %d", n, sp.size)
	}
	cfg := []byte(`{"descriptor":{"name":"sparse"},"config":{},"modelfs":{"type":"layers","diffIds":["` + w + `"]}}`)
	uploadBlob(t, reg, "mp/sparse", cfg)
	mf, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": mtManifest, "artifactType": mpArtifact,
		"config": descriptor{MediaType: mpConfig, Digest: digestOf(cfg), Size: int64(len(cfg))},
		"layers": []descriptorAnn{{descriptor{MediaType: mpType("weight", "raw"), Digest: w, Size: sp.size}, map[string]string{mpFilepath: "model.safetensors"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	putManifest(t, reg, "mp/sparse", "v1", mtManifest, mf)
	ref := reg.Host + "/mp/sparse@" + digestOf(mf)
	t.Logf("generated and uploaded %d bytes in %v", sp.size, time.Since(start).Round(time.Millisecond))

	reg.ResetStats()
	t0 := time.Now()
	mp := mount(t, ref)
	reg.Settle(t)
	open := reg.Stats()
	t.Logf("opening the mount: %v, %d requests, %d blob bytes", time.Since(t0).Round(time.Millisecond), total(open.Requests), open.BlobBytesOut)
	reg.ResetStats()

	tn := sp.tensors[mid]
	want := make([]byte, tn.end-tn.begin)
	sp.ReadAt(want, tn.begin)
	f, err := os.Open(filepath.Join(mp, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, tn.begin); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !bytes.Equal(got, want) {
		t.Fatal("the tensor read through the mount differs from the model's")
	}
	reg.Settle(t)
	st := reg.Stats()
	t.Logf("one tensor of %d bytes at %d: %d requests (%v), %d blob bytes (%.3fx)", len(want), tn.begin, total(st.Requests), st.Requests, st.BlobBytesOut, float64(st.BlobBytesOut)/float64(len(want)))
	if k := total(st.Requests); k > 3 {
		t.Errorf("reading one tensor took %d registry requests, want at most 3: %v", k, st.Requests)
	}
	if st.BlobBytesOut > int64(float64(len(want))*1.1) {
		t.Errorf("reading one tensor of %d bytes fetched %d bytes, more than 1.1x", len(want), st.BlobBytesOut)
	}
	t0 = time.Now()
	mustRun(t, "umount", mp)
	t.Logf("unmounting: %v", time.Since(t0).Round(time.Millisecond))

	reg.ResetStats()
	t0 = time.Now()
	dir := filepath.Join(t.TempDir(), "out")
	res := runFor(t, "", 10*time.Minute, "pull", ref, dir)
	if res.code != 0 {
		t.Fatalf("pull failed:\n%s", res)
	}
	st = reg.Stats()
	pullTime := time.Since(t0)
	if res.maxRSS == 0 || res.maxRSS > 512<<20 {
		t.Errorf("pull of a 5 GiB model: peak RSS %d MiB, want at most 512 MiB", res.maxRSS>>20)
	}
	t0 = time.Now()
	pf, err := os.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	h := sha256.New()
	m, err := io.Copy(h, pf)
	if err != nil {
		t.Fatal(err)
	}
	if d := "sha256:" + hex.EncodeToString(h.Sum(nil)); m != sp.size || d != w {
		t.Fatalf("pulled file: %d bytes, %s; want %d bytes, %s", m, d, sp.size, w)
	}
	t.Logf("pull: %v, %d requests, %d blob bytes, peak RSS %d MiB; checking the %d pulled bytes took %v; the test took %v",
		pullTime.Round(time.Millisecond), total(st.Requests), st.BlobBytesOut, res.maxRSS>>20, m, time.Since(t0).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
