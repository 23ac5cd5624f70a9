package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestModelPackSignedIndexFreshNode: a model whose derived index was
// published with `index-modelpack --key` opens lazily on a machine that
// has never seen it, for a reader whose signature policy trusts the key:
// through `mount` and through the CSI plugin (fresh caches), opening the
// mount and reading one tensor from the middle of the weights costs at
// most 1.2 times the tensor's bytes at the registry. A reader trusting
// another key (which signed the model but not the index) reads the layers
// whole, as before.
func TestModelPackSignedIndexFreshNode(t *testing.T) {
	requireFUSE(t)
	reg := newDistribution(t)
	m, w, starts, sizes := bigRawModel(t)
	ref := m.push(t, target{name: "distribution", reg: reg}, "mp/signed", "v1")
	keys := t.TempDir()
	priv, pub := keyPair(t, keys, "index")
	priv2, pub2 := keyPair(t, keys, "other")
	for _, k := range []string{priv, priv2} {
		if r := signRun(t, "sign", ref, "--key", k); r.code != 0 {
			t.Fatalf("sign the model:\n%s", r)
		}
	}
	if r := signRun(t, "index-modelpack", ref, "--key", priv); r.code != 0 || !strings.Contains(r.stdout, "@sha256:") {
		t.Fatalf("index-modelpack:\n%s", r)
	}

	const k = 4
	for _, c := range []struct {
		key     string
		trusted bool
	}{{pub, true}, {pub2, false}} {
		reg.ResetStats()
		mp := mount(t, ref, "--cache-dir", filepath.Join(t.TempDir(), "fresh"), "--require-signature", c.key)
		readTensor(t, filepath.Join(mp, "model.safetensors"), w, starts, sizes, k)
		reg.Settle(t)
		st := reg.Stats()
		ratio := float64(st.BlobBytesOut) / float64(sizes[k])
		t.Logf("mount, trusted %v: fresh open and one tensor of %d bytes: %d requests, %d blob bytes (%.3fx)", c.trusted, sizes[k], total(st.Requests), st.BlobBytesOut, ratio)
		if c.trusted && ratio > 1.2 {
			t.Errorf("mount with the index's key: a fresh open and one tensor fetched %.3fx the tensor's bytes, want at most 1.2x", ratio)
		}
		if !c.trusted && st.BlobBytesOut < int64(len(w)) {
			t.Errorf("mount trusting another key fetched %d bytes: the layers were not read whole, so the unsigned index was used", st.BlobBytesOut)
		}
		mustRun(t, "umount", mp)
	}

	// The CSI plugin: the volume's requireSignature names the key inline.
	pem, err := os.ReadFile(pub)
	if err != nil {
		t.Fatal(err)
	}
	n := startCSI(t, time.Minute)
	p := n.newPod("mp-signed")
	reg.ResetStats()
	if err := n.publishWith(p, ref, "", map[string]string{"prefetch": "headers", "requireSignature": string(pem)}); err != nil {
		t.Fatal(err)
	}
	readTensor(t, filepath.Join(p.target, "model.safetensors"), w, starts, sizes, k)
	reg.Settle(t)
	st := reg.Stats()
	ratio := float64(st.BlobBytesOut) / float64(sizes[k])
	t.Logf("CSI: fresh publish and one tensor of %d bytes: %d requests, %d blob bytes (%.3fx)", sizes[k], total(st.Requests), st.BlobBytesOut, ratio)
	if ratio > 1.2 {
		t.Errorf("CSI with the index's key: a fresh publish and one tensor fetched %.3fx the tensor's bytes, want at most 1.2x", ratio)
	}
	if err := n.unpublish(p); err != nil {
		t.Fatal(err)
	}
}
