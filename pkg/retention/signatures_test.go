package retention

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/pkg/signature"
)

// Purging a version deletes its signatures; soft-deleting it and keeping
// the others leave theirs.
func TestPurgeDeletesSignatures(t *testing.T) {
	ctx := context.Background()
	r := openLayout(t)
	vs := threeVersions(t, r)
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := signature.NewSigner(k)
	if err != nil {
		t.Fatal(err)
	}
	keys := []signature.Verifier{s.Verifier()}
	for _, v := range vs {
		if _, err := signature.Sign(ctx, r.t, "vol", v.Root, s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := SoftDelete(ctx, r.t, vs[0].Root.Digest, DeleteOptions{Now: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := signature.Verify(ctx, r.t, vs[0].Root, keys); err != nil {
		t.Fatalf("soft-deleted version lost its signature: %v", err)
	}
	plan, err := NewPlan(Input{Deleted: r.deleted(t)}, Policy{Purge: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(ctx, r.t, plan, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := signature.Verify(ctx, r.t, vs[0].Root, keys); !errors.Is(err, signature.ErrUnsigned) {
		t.Fatalf("purged version's signature: %v", err)
	}
	for _, v := range vs[1:] {
		if _, err := signature.Verify(ctx, r.t, v.Root, keys); err != nil {
			t.Fatalf("kept version %s: %v", v.Root.Digest, err)
		}
	}
}
