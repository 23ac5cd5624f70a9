package signature

import (
	"context"
	"testing"

	"github.com/opencontainers/go-digest"
)

func TestStatusesOfSignedAndUnsignedVersions(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, _ := newKey(t, dir, "a")
	b, _ := newKey(t, dir, "b")
	tg, v1, v2 := openLayout(t)
	if _, err := Sign(ctx, tg, "repo", v1, a); err != nil {
		t.Fatal(err)
	}
	ds := []digest.Digest{v1.Digest, v2.Digest}
	// Without keys: signed or not, and the key id the signature claims.
	got, err := Statuses(ctx, tg, ds, Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[0].Signed || len(got[0].Claimed) != 1 || got[0].Claimed[0] != a.Verifier().KeyID() ||
		got[1].Signed || got[1].Error != "" || got[0].Verified != "" {
		t.Fatalf("statuses without keys: %+v", got)
	}
	// With a's key: v1 verifies; v2 is looked at too, and fails.
	got, err = Statuses(ctx, tg, ds, Policy{Keys: []Verifier{a.Verifier()}})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Verified != a.Verifier().KeyID() || got[1].Signed || got[1].Error == "" {
		t.Fatalf("statuses with the signing key: %+v", got)
	}
	// With another key: v1 is signed, not verified.
	got, err = Statuses(ctx, tg, ds, Policy{Keys: []Verifier{b.Verifier()}})
	if err != nil {
		t.Fatal(err)
	}
	if !got[0].Signed || got[0].Verified != "" || got[0].Error == "" {
		t.Fatalf("statuses with another key: %+v", got)
	}
	// A version that is not there, under a policy that looks at every one.
	missing := digest.FromString("nothing")
	if _, err := Statuses(ctx, tg, []digest.Digest{missing}, Policy{Keys: []Verifier{a.Verifier()}}); err == nil {
		t.Error("Statuses of a missing version succeeded")
	}
}

// TestStatusStringQuotesClaimedKey: a key id claimed in a signature layer's
// annotation is the repository's text; the table form quotes one that a
// terminal would act on, and keeps a plain one as it is.
func TestStatusStringQuotesClaimedKey(t *testing.T) {
	cases := map[string]Status{
		`key "k\x1b]0;x\a",0123456789abcdef`: {Signed: true, Claimed: []string{"k\x1b]0;x\x07", "0123456789abcdef0123"}},
		`key "\r\nforged"`:                   {Signed: true, Claimed: []string{"\r\nforged"}},
		`verified 0123456789abcdef`:          {Signed: true, Verified: "0123456789abcdef0123", Claimed: []string{"\x1b[2J"}},
	}
	for want, s := range cases {
		if got := s.String(); got != want {
			t.Errorf("%q: String() = %q, want %q", s.Claimed, got, want)
		}
	}
}
