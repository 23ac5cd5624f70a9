package signature

import "github.com/opencontainers/go-digest"

// SignedJSON is what `bdnvol sign --json` prints of e, the signature just
// made of the version d, whose digest-pinned reference is pinned.
// signature_referrer is the OCI 1.1 referrer Sign also wrote, if any.
func (e Entry) SignedJSON(pinned string, d digest.Digest) map[string]string {
	m := map[string]string{
		"reference": pinned, "digest": d.String(), "key": e.KeyID,
		"signature_tag": Tag(d), "signature_manifest": e.Manifest.Digest.String(),
	}
	if e.ReferrerManifest.Digest != "" {
		m["signature_referrer"] = e.ReferrerManifest.Digest.String()
	}
	return m
}

// JSON is what `bdnvol verify --key --json` prints of v, for the version
// whose digest-pinned reference is pinned.
func (v *Verified) JSON(pinned string) map[string]any {
	return map[string]any{
		"reference": pinned, "digest": v.Digest.String(), "key": v.KeyID,
		"referrer": v.Entry.Referrer, "signature_manifest": v.Entry.Manifest.Digest.String(),
	}
}
