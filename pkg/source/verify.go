package source

import (
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"strconv"
	"sync"

	"github.com/bdnvol/bdnvol/pkg/push"
)

// Digest algorithms a source may give for a file.
const (
	algoSHA256  = "sha256"
	algoGitSHA1 = "git-sha1" // git blob id: SHA-1 of "blob SIZE\x00" and the bytes
	algoMD5     = "md5"
)

// expectation is the digest a store gives for a file; the zero value
// expects nothing.
type expectation struct {
	algo string
	hex  string // lower-case hex
}

func expectSHA256(hexSum string) expectation { return expectation{algoSHA256, hexSum} }

func expectGitSHA1(hexSum string) expectation { return expectation{algoGitSHA1, hexSum} }

// expectMD5Base64 parses GCS's base64 md5Hash.
func expectMD5Base64(b64 string) expectation {
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(b) != md5.Size {
		return expectation{}
	}
	return expectation{algoMD5, hex.EncodeToString(b)}
}

func (e expectation) newHash(size int64) hash.Hash {
	switch e.algo {
	case algoSHA256:
		return sha256.New()
	case algoMD5:
		return md5.New()
	case algoGitSHA1:
		h := sha1.New()
		io.WriteString(h, "blob "+strconv.FormatInt(size, 10)+"\x00")
		return h
	}
	return nil
}

// MismatchError reports a file whose bytes disagree with the source's
// digest for it.
type MismatchError struct {
	Source    string
	Path      string
	Algorithm string
	Want, Got string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s: %s: %v: %s %s, got %s", e.Source, e.Path, ErrDigestMismatch, e.Algorithm, e.Want, e.Got)
}

// Unwrap returns ErrDigestMismatch.
func (e *MismatchError) Unwrap() error { return ErrDigestMismatch }

// verifier hashes the bytes of a file as they are read in order (reads
// that go back are served but not hashed again) and fails the read that
// reaches the end of the file when the digest is wrong.
type verifier struct {
	push.ReadAtCloser
	size   int64
	want   expectation
	source string
	path   string

	mu     sync.Mutex
	h      hash.Hash
	hashed int64
	err    error // the mismatch, once known
	done   bool
}

func newVerifier(r push.ReadAtCloser, size int64, want expectation, source, path string) push.ReadAtCloser {
	h := want.newHash(size)
	if h == nil {
		return r
	}
	return &verifier{ReadAtCloser: r, size: size, want: want, source: source, path: path, h: h}
}

func (v *verifier) ReadAt(p []byte, off int64) (int, error) {
	n, err := v.ReadAtCloser.ReadAt(p, off)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.err != nil {
		return 0, v.err
	}
	if off <= v.hashed && off+int64(n) > v.hashed {
		v.h.Write(p[v.hashed-off : n])
		v.hashed = off + int64(n)
	}
	if v.hashed == v.size && !v.done {
		v.done = true
		got := hex.EncodeToString(v.h.Sum(nil))
		if got != v.want.hex {
			v.err = &MismatchError{Source: v.source, Path: v.path, Algorithm: v.want.algo, Want: v.want.hex, Got: got}
			return 0, v.err
		}
	}
	return n, err
}
