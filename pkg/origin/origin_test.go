package origin

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"path/filepath"
	"testing"

	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/signature"
)

// pushed returns a layout holding one version tagged v1, and its root.
func pushed(t *testing.T) (oci.Ref, oci.Target, push.Result) {
	t.Helper()
	src := t.TempDir()
	testutil.WriteTree(t, src, map[string][]byte{"a.bin": testutil.RandBytes(1, 300<<10)})
	ref := oci.Ref{Layout: filepath.Join(t.TempDir(), "vols"), Tag: "v1"}
	tg, err := oci.Open(context.Background(), ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := push.Push(context.Background(), tg, push.DirSource(src), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tg.Tag(context.Background(), res.Root, "v1"); err != nil {
		t.Fatal(err)
	}
	return ref, tg, *res
}

// TestResolvePreloadsAndPins: the tag resolves to the pushed root, the
// manifest is in the cache after Resolve, and a layout is not wrapped.
func TestResolvePreloadsAndPins(t *testing.T) {
	ctx := context.Background()
	ref, _, res := pushed(t)
	cache, err := chunkcache.Open(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	wrapped := 0
	wrap := func(source, host string, f content.Fetcher) content.Fetcher { wrapped++; return f }
	o, err := Resolve(ctx, ref, Options{Preload: cache, Wrap: wrap})
	if err != nil {
		t.Fatal(err)
	}
	if o.Root.Digest != res.Root.Digest || o.Pinned() != ref.Pinned(res.Root.Digest) {
		t.Fatalf("root %s pinned %s, want %s", o.Root.Digest, o.Pinned(), res.Root.Digest)
	}
	if !cache.Contains(res.Root.Digest) {
		t.Fatal("the manifest was not preloaded into the cache")
	}
	if wrapped != 0 || o.Mirrors != nil {
		t.Fatalf("a layout was wrapped %d times, mirrors %v", wrapped, o.Mirrors)
	}
	if _, err := layout.Open(ctx, o.Fetcher, o.Root); err != nil {
		t.Fatalf("the fetcher does not read the version: %v", err)
	}
}

// TestResolveUnderPolicy: an unsigned version is refused by a policy
// requiring a key, and accepted once signed by it.
func TestResolveUnderPolicy(t *testing.T) {
	ctx := context.Background()
	ref, tg, res := pushed(t)
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := signature.NewSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	p := signature.Policy{Keys: []signature.Verifier{s.Verifier()}}
	if _, err := Resolve(ctx, ref, Options{Policy: p}); !errors.Is(err, signature.ErrRefused) {
		t.Fatalf("unsigned version under a policy: err %v, want ErrRefused", err)
	}
	if _, err := signature.Sign(ctx, tg, ref.Repo(), res.Root, s); err != nil {
		t.Fatal(err)
	}
	o, err := Resolve(ctx, ref, Options{Policy: p})
	if err != nil || o.Root.Digest != res.Root.Digest {
		t.Fatalf("signed version: %v, %v", o, err)
	}
}
