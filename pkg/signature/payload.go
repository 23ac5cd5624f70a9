package signature

import (
	"encoding/json"
	"fmt"

	"github.com/opencontainers/go-digest"
)

// cosignType is the type that cosign's simple-signing payloads carry.
const cosignType = "cosign container image signature"

// payload is the simple-signing document cosign signs.
type payload struct {
	Critical struct {
		Identity struct {
			DockerReference string `json:"docker-reference"`
		} `json:"identity"`
		Image struct {
			DockerManifestDigest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
	Optional map[string]any `json:"optional"`
}

// Payload returns the simple-signing payload that signs d as the version of repo.
func Payload(repo string, d digest.Digest) ([]byte, error) {
	var p payload
	p.Critical.Identity.DockerReference = repo
	p.Critical.Image.DockerManifestDigest = d.String()
	p.Critical.Type = cosignType
	return json.Marshal(p)
}

// signedDigest returns the digest a simple-signing payload names.
func signedDigest(b []byte) (digest.Digest, error) {
	var p payload
	if err := json.Unmarshal(b, &p); err != nil {
		return "", fmt.Errorf("simple-signing payload: %w", err)
	}
	if p.Critical.Type != cosignType {
		return "", fmt.Errorf("simple-signing payload of type %q", p.Critical.Type)
	}
	d, err := digest.Parse(p.Critical.Image.DockerManifestDigest)
	if err != nil {
		return "", fmt.Errorf("simple-signing payload: %w", err)
	}
	return d, nil
}
