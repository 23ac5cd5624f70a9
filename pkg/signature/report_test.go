package signature

import (
	"encoding/json"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func TestSignedAndVerifiedJSON(t *testing.T) {
	d := digest.FromString("version")
	m := digest.FromString("signature manifest")
	e := Entry{KeyID: "k1", Manifest: ocispec.Descriptor{Digest: m}, Referrer: true}
	b, _ := json.Marshal(e.SignedJSON("reg.example/a@"+d.String(), d))
	want := `{"digest":"` + d.String() + `","key":"k1","reference":"reg.example/a@` + d.String() + `","signature_manifest":"` + m.String() + `","signature_tag":"` + Tag(d) + `"}`
	if string(b) != want {
		t.Errorf("sign JSON %s\nwant %s", b, want)
	}
	b, _ = json.Marshal((&Verified{Digest: d, KeyID: "k1", Entry: e}).JSON("reg.example/a@" + d.String()))
	want = `{"digest":"` + d.String() + `","key":"k1","reference":"reg.example/a@` + d.String() + `","referrer":true,"signature_manifest":"` + m.String() + `"}`
	if string(b) != want {
		t.Errorf("verify JSON %s\nwant %s", b, want)
	}
}

func TestSignedJSONReferrer(t *testing.T) {
	d := digest.FromString("version")
	r := digest.FromString("referrer")
	e := Entry{KeyID: "k1", Manifest: ocispec.Descriptor{Digest: digest.FromString("m")}, ReferrerManifest: ocispec.Descriptor{Digest: r}}
	if got := e.SignedJSON("reg.example/a@"+d.String(), d)["signature_referrer"]; got != r.String() {
		t.Errorf("signature_referrer %q, want %s", got, r)
	}
}
