package modelpack

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

func newSigner(t *testing.T) signature.Signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := signature.NewSigner(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// publishedFixture is the cache fixture's model in an OCI layout, with its
// index published and signed by the returned signer.
func publishedFixture(t *testing.T) (oci.Target, ocispec.Descriptor, ocispec.Descriptor, signature.Signer, map[string][]byte) {
	t.Helper()
	ctx := context.Background()
	mem, desc, files := cacheFixture(t)
	ref, err := oci.ParseRef("oci:" + filepath.Join(t.TempDir(), "models"))
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := oras.CopyGraph(ctx, mem.Storage, tg, desc, oras.CopyGraphOptions{}); err != nil {
		t.Fatal(err)
	}
	idx, err := PublishIndex(ctx, tg, desc)
	if err != nil {
		t.Fatal(err)
	}
	s := newSigner(t)
	if _, err := signature.Sign(ctx, tg, ref.Repo(), idx, s); err != nil {
		t.Fatal(err)
	}
	return tg, desc, idx, s, files
}

// openCounted opens the model under trust and reports whether it took a
// published index, and how many blobs it fetched whole from the model's
// store (the manifest is one).
func openCounted(t *testing.T, tg oci.Target, desc ocispec.Descriptor, trust signature.Policy) (bool, int, *rangeStore) {
	t.Helper()
	src := &rangeStore{Storage: tg}
	var said []string
	ctx := WithTrust(context.Background(), Trust{Target: tg, Policy: trust, Logf: func(f string, a ...any) { said = append(said, f) }})
	before := OpenCounts()
	v, err := OpenCached(ctx, src, desc, nil)
	if err != nil {
		t.Fatal(err)
	}
	after := OpenCounts()
	if len(said) != 1 {
		t.Errorf("the open said %d things, want 1 (what it did with the index): %q", len(said), said)
	}
	if v.Root.Digest != desc.Digest {
		t.Errorf("opened %s, want %s", v.Root.Digest, desc.Digest)
	}
	return after.Published > before.Published, src.whole, src
}

// TestPublishedIndex: a model whose index was published and signed opens
// from the manifest and that index alone for a reader trusting the key
// (its files read back byte for byte, by range); a reader trusting another
// key, or no key, or finding only an index altered after signing, reads
// every layer whole, as before.
func TestPublishedIndex(t *testing.T) {
	ctx := context.Background()
	tg, desc, idx, s, files := publishedFixture(t)
	trusted := signature.Policy{Keys: []signature.Verifier{s.Verifier()}}

	took, whole, src := openCounted(t, tg, desc, trusted)
	if !took || whole != 1 {
		t.Fatalf("trusted key: took the published index %v, %d whole fetches from the model (want the manifest only)", took, whole)
	}
	v, err := OpenCached(WithTrust(ctx, Trust{Target: tg, Policy: trusted}), src, desc, nil)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range files {
		if got := readFile(t, v, src, p); !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes through the published index, want %d", p, len(got), len(want))
		}
	}

	for name, p := range map[string]signature.Policy{
		"another key": {Keys: []signature.Verifier{newSigner(t).Verifier()}},
		"no key":      {},
	} {
		took, whole, _ := openCounted(t, tg, desc, p)
		if took || whole != 5 {
			t.Errorf("%s: took the published index %v, %d whole fetches (want the manifest and 4 layers)", name, took, whole)
		}
	}

	// Altered after signing: the record's manifest annotated anew (a new
	// digest the signature does not name), the original gone.
	b, err := content.FetchAll(ctx, tg, idx)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	m["annotations"] = map[string]string{"altered": "yes"}
	ab, _ := json.Marshal(m)
	altered := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, ab)
	if err := tg.Push(ctx, altered, bytes.NewReader(ab)); err != nil {
		t.Fatal(err)
	}
	if err := tg.Delete(ctx, idx); err != nil {
		t.Fatal(err)
	}
	refs, err := oci.Referrers(ctx, tg, desc, IndexArtifactType)
	if err != nil || len(refs) != 1 || refs[0].Digest != altered.Digest {
		t.Fatalf("referrers after the alteration: %v %v", refs, err)
	}
	if took, whole, _ := openCounted(t, tg, desc, trusted); took || whole != 5 || !strings.Contains(string(ab), "altered") {
		t.Errorf("an index altered after signing: took it %v, %d whole fetches (want the layers read)", took, whole)
	}
}
