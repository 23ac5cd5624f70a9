// Package verify is the one place that decides whether bytes may be used:
// they must have the size and the digest their descriptor names. Callers
// that hash as they copy (one pass over the bytes) hand the result to End
// or Digest; callers that read a stream wrap it with Reader or ReadAll.
// Every mismatch is an *Error, which wraps ErrDigestMismatch.
package verify

import (
	"bytes"
	"context"
	_ "crypto/sha256" // the algorithm of every bdnvol digest
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// ErrDigestMismatch is wrapped when bytes do not have the size or the
// digest they must have.
var ErrDigestMismatch = errors.New("content does not match its digest")

// Error reports bytes that do not match their descriptor: too few, too
// many, or another digest. It wraps ErrDigestMismatch (and matches oras-go's
// content.ErrMismatchedDigest, the same condition).
type Error struct {
	What string        // the object, for the message: "chunk", "manifest", "file a/b"; empty when the caller names it
	Want digest.Digest // the digest the bytes must have
	Size int64         // the size the bytes must have
	Got  digest.Digest // the digest of the bytes received; empty when the size was wrong
	Read int64         // the bytes received; Size+1 means more than Size
}

// Error describes the mismatch, naming the object when What is set (a
// caller that leaves it empty names the object in its own wrapping).
func (e *Error) Error() string {
	var msg string
	switch {
	case e.Read > e.Size:
		msg = fmt.Sprintf("%v: more than %d bytes", ErrDigestMismatch, e.Size)
	case e.Read < e.Size:
		msg = fmt.Sprintf("%v: %d of %d bytes", ErrDigestMismatch, e.Read, e.Size)
	default:
		msg = fmt.Sprintf("%v: got %s (%d bytes)", ErrDigestMismatch, e.Got, e.Read)
	}
	if e.What == "" {
		return msg
	}
	return e.What + " " + string(e.Want) + ": " + msg
}

// Unwrap returns ErrDigestMismatch.
func (e *Error) Unwrap() error { return ErrDigestMismatch }

// Is reports whether target is oras-go's content.ErrMismatchedDigest, so that
// code written against oras-go's checks recognises the same condition.
func (e *Error) Is(target error) bool { return target == content.ErrMismatchedDigest }

// check reports whether desc can be verified: its digest valid, its
// algorithm available, its size not negative.
func check(what string, desc ocispec.Descriptor) error {
	if err := desc.Digest.Validate(); err != nil {
		return fmt.Errorf("%s: digest %q: %w", label(what), desc.Digest, err)
	}
	if desc.Size < 0 {
		return fmt.Errorf("%s %s: negative size %d", label(what), desc.Digest, desc.Size)
	}
	return nil
}

func label(what string) string {
	if what == "" {
		return "blob"
	}
	return what
}

// Digest checks that n bytes hashed to got are the bytes desc names. n is
// desc.Size+1 when more than desc.Size bytes came. It returns nil, an
// *Error, or an error for a descriptor that cannot be verified.
func Digest(what string, desc ocispec.Descriptor, got digest.Digest, n int64) error {
	if err := check(what, desc); err != nil {
		return err
	}
	switch {
	case n > desc.Size:
		return &Error{What: what, Want: desc.Digest, Size: desc.Size, Read: desc.Size + 1}
	case n < desc.Size:
		return &Error{What: what, Want: desc.Digest, Size: desc.Size, Read: n}
	case got != desc.Digest:
		return &Error{What: what, Want: desc.Digest, Size: desc.Size, Got: got, Read: n}
	}
	return nil
}

// Bytes checks that b are the bytes desc names.
func Bytes(what string, b []byte, desc ocispec.Descriptor) error {
	if err := check(what, desc); err != nil {
		return err
	}
	if int64(len(b)) != desc.Size {
		return Digest(what, desc, "", int64(len(b)))
	}
	return Digest(what, desc, desc.Digest.Algorithm().FromBytes(b), desc.Size)
}

// End checks, once n bytes of r were read and hashed to got, that r has no
// byte more and that the bytes are desc's. It reads at most one byte of r.
func End(what string, desc ocispec.Descriptor, r io.Reader, got digest.Digest, n int64) error {
	if n == desc.Size && extra(r) {
		n++
	}
	return Digest(what, desc, got, n)
}

// extra reports whether r has a byte more.
func extra(r io.Reader) bool {
	var one [1]byte
	for range 3 { // a reader may return (0, nil); do not spin on one
		m, err := r.Read(one[:])
		if m > 0 {
			return true
		}
		if err != nil {
			return false
		}
	}
	return false
}

// VerifyingReader passes desc's bytes through and, instead of io.EOF,
// returns an *Error when they turn out not to be desc's: so a caller that
// reads to io.EOF has verified bytes, and one that gets an error must drop
// what it read.
type VerifyingReader struct {
	r    io.Reader
	what string
	desc ocispec.Descriptor
	h    hash.Hash
	n    int64
	err  error // sticky: set once the end is reached or a read fails
}

// Reader returns a reader of r that verifies the bytes against desc. It
// never passes on more than desc.Size bytes.
func Reader(r io.Reader, what string, desc ocispec.Descriptor) *VerifyingReader {
	v := &VerifyingReader{r: r, what: what, desc: desc}
	if err := check(what, desc); err != nil {
		v.err = err
	} else {
		v.h = desc.Digest.Algorithm().Hash()
	}
	return v
}

// Read reads up to len(p) bytes; at the end it returns io.EOF only if all the
// bytes were desc's.
func (v *VerifyingReader) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	if left := v.desc.Size - v.n; int64(len(p)) > left {
		p = p[:left]
	}
	var (
		n   int
		err error
	)
	if len(p) > 0 {
		n, err = v.r.Read(p)
		v.h.Write(p[:n])
		v.n += int64(n)
	}
	switch {
	case v.n == v.desc.Size:
		v.err = End(v.what, v.desc, v.r, digest.NewDigest(v.desc.Digest.Algorithm(), v.h), v.n)
		if v.err == nil {
			v.err = io.EOF
		}
		if n > 0 && v.err == io.EOF {
			return n, nil
		}
		return n, v.err
	case err == io.EOF:
		v.err = Digest(v.what, v.desc, "", v.n)
	case err != nil:
		v.err = err
	}
	return n, v.err
}

// Verified reports whether all of desc's bytes were read and verified.
func (v *VerifyingReader) Verified() bool { return v.err == io.EOF }

// ReadAll reads r to the end and returns its bytes if they are desc's. It
// never reads more than desc.Size+1 bytes.
func ReadAll(r io.Reader, what string, desc ocispec.Descriptor) ([]byte, error) {
	if err := check(what, desc); err != nil {
		return nil, err
	}
	b := make([]byte, desc.Size)
	vr := Reader(r, what, desc)
	if _, err := io.ReadFull(vr, b); err != nil {
		return nil, err
	}
	if _, err := vr.Read(nil); err != io.EOF { // the verdict, kept by vr
		return nil, err
	}
	return b, nil
}

// Fetch fetches desc from src and returns its bytes if they are desc's: what
// oras-go's content.FetchAll does, with this package's error.
func Fetch(ctx context.Context, src content.Fetcher, what string, desc ocispec.Descriptor) ([]byte, error) {
	if err := check(what, desc); err != nil {
		return nil, err
	}
	rc, err := src.Fetch(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return ReadAll(rc, what, desc)
}

// FetchTo fetches desc from src and hands its bytes to read as they come,
// without holding them: read takes what it needs (it may stop early), and
// FetchTo reads the rest. It returns an error unless the bytes were desc's;
// what read made of them may be used only when it returns nil.
func FetchTo(ctx context.Context, src content.Fetcher, what string, desc ocispec.Descriptor, read func(io.Reader)) error {
	if err := check(what, desc); err != nil {
		return err
	}
	rc, err := src.Fetch(ctx, desc)
	if err != nil {
		return err
	}
	defer rc.Close()
	vr := Reader(rc, what, desc)
	read(vr)
	if _, err := io.Copy(io.Discard, vr); err != nil {
		return err
	}
	if _, err := vr.Read(nil); err != io.EOF { // the verdict, kept by vr
		return err
	}
	return nil
}

// Checked reads bytes already verified against a descriptor: a consumer
// that would hash them to verify them (a pull writing a chunk it fetched)
// may take Vouches' word instead. It serves the whole of them, from the
// first byte.
type Checked struct {
	*bytes.Reader
	b       []byte
	desc    ocispec.Descriptor
	release func()
}

// NewChecked returns a reader of b, verified to be desc's bytes; release
// (when not nil) runs once at Close, after which b is not read.
func NewChecked(b []byte, desc ocispec.Descriptor, release func()) *Checked {
	return &Checked{Reader: bytes.NewReader(b), b: b, desc: desc, release: release}
}

// Bytes returns the verified bytes themselves (not a copy), for a consumer
// that writes them out without reading them through a buffer; they are
// valid until Close. Reads do not consume them.
func (c *Checked) Bytes() []byte { return c.b }

// CheckedOf returns the Checked r is, or wraps (a wrapper that passes a
// Checked's bytes through unchanged says so with a method Checked()
// *Checked), nil if none.
func CheckedOf(r any) *Checked {
	switch c := r.(type) {
	case *Checked:
		return c
	case interface{ Checked() *Checked }:
		return c.Checked()
	}
	return nil
}

// Vouches reports whether c's bytes were verified to be desc's.
func (c *Checked) Vouches(desc ocispec.Descriptor) bool {
	return c != nil && c.desc.Digest == desc.Digest && c.desc.Size == desc.Size && c.Reader.Size() == desc.Size
}

// Close releases the bytes.
func (c *Checked) Close() error {
	if c.release != nil {
		c.release()
		c.release = nil
	}
	c.Reader, c.b = bytes.NewReader(nil), nil
	return nil
}
