package profile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// MediaType is the media type of a profile document, and the artifact type
// of the referrer that attaches one to its version.
const MediaType = "application/vnd.bdnvol.profile.v1+json"

// MaxChunks bounds the chunks of a profile: a recorder stops there, and a
// document listing more is refused.
const MaxChunks = 1 << 17

// MaxBytes bounds the size of a profile document.
const MaxBytes = 128 + MaxChunks*80 // a line per chunk: indent, quoted digest, comma

// Profile is the chunks of one version read during a start window, in
// first-read order.
type Profile struct {
	MediaType string          `json:"mediaType"`
	Version   digest.Digest   `json:"version"`
	Chunks    []digest.Digest `json:"chunks"`
}

// New returns the profile of version v listing chunks in order.
func New(v digest.Digest, chunks []digest.Digest) *Profile {
	if chunks == nil {
		chunks = []digest.Digest{}
	}
	return &Profile{MediaType: MediaType, Version: v, Chunks: chunks}
}

// Encode returns p as a document: the same profile always gives the same
// bytes.
func (p *Profile) Encode() []byte {
	var b bytes.Buffer
	b.WriteString("{\n  \"mediaType\": ")
	writeString(&b, p.MediaType)
	b.WriteString(",\n  \"version\": ")
	writeString(&b, string(p.Version))
	b.WriteString(",\n  \"chunks\": [")
	for i, d := range p.Chunks {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("\n    ")
		writeString(&b, string(d))
	}
	if len(p.Chunks) > 0 {
		b.WriteString("\n  ")
	}
	b.WriteString("]\n}\n")
	return b.Bytes()
}

func writeString(b *bytes.Buffer, s string) {
	q, _ := json.Marshal(s) // a string always marshals
	b.Write(q)
}

// Parse reads a profile document, refusing one larger than MaxBytes, of
// another media type, with a malformed digest, more than MaxChunks chunks
// or a chunk listed twice.
func Parse(b []byte) (*Profile, error) {
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrInvalid, len(b), MaxBytes)
	}
	var p Profile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the document", ErrInvalid)
	}
	if p.MediaType != MediaType {
		return nil, fmt.Errorf("%w: media type %q, want %s", ErrInvalid, p.MediaType, MediaType)
	}
	if err := checkDigest(p.Version); err != nil {
		return nil, fmt.Errorf("%w: version: %v", ErrInvalid, err)
	}
	if len(p.Chunks) > MaxChunks {
		return nil, fmt.Errorf("%w: %d chunks, more than %d", ErrInvalid, len(p.Chunks), MaxChunks)
	}
	seen := make(map[digest.Digest]bool, len(p.Chunks))
	for i, d := range p.Chunks {
		if err := checkDigest(d); err != nil {
			return nil, fmt.Errorf("%w: chunk %d: %v", ErrInvalid, i, err)
		}
		if seen[d] {
			return nil, fmt.Errorf("%w: chunk %s listed twice", ErrInvalid, d)
		}
		seen[d] = true
	}
	if p.Chunks == nil {
		p.Chunks = []digest.Digest{}
	}
	return &p, nil
}

// checkDigest accepts only sha256 digests, the only ones a version uses.
func checkDigest(d digest.Digest) error {
	if !strings.HasPrefix(string(d), string(digest.SHA256)+":") {
		return fmt.Errorf("digest %.80q: not sha256", d)
	}
	if err := d.Validate(); err != nil {
		return fmt.Errorf("digest %.80q: %w", d, err)
	}
	return nil
}

// Order returns the chunk indices of ver in p's order, skipping chunks ver
// does not have; ErrOtherVersion when p belongs to another version.
func (p *Profile) Order(ver *layout.Version) ([]int, error) {
	if p.Version != ver.Root.Digest {
		return nil, fmt.Errorf("%w: %s, not %s", ErrOtherVersion, p.Version, ver.Root.Digest)
	}
	at := make(map[digest.Digest]int, ver.NumChunks())
	for k := ver.NumChunks() - 1; k >= 0; k-- {
		at[ver.Index.ChunkDigest(k)] = k
	}
	out := make([]int, 0, len(p.Chunks))
	for _, d := range p.Chunks {
		if k, ok := at[d]; ok {
			out = append(out, k)
		}
	}
	return out, nil
}
