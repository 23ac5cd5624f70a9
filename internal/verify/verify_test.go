package verify

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

func descOf(b []byte) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: "application/octet-stream", Digest: digest.FromBytes(b), Size: int64(len(b))}
}

// readers are the ways a body can arrive: whole, a byte at a time, with
// io.EOF on the last data.
var readers = map[string]func([]byte) io.Reader{
	"whole":   func(b []byte) io.Reader { return bytes.NewReader(b) },
	"onebyte": func(b []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(b)) },
	"dataerr": func(b []byte) io.Reader { return iotest.DataErrReader(bytes.NewReader(b)) },
}

// mismatch asserts err is an *Error for want with the given bytes read.
func mismatch(t *testing.T, err error, want ocispec.Descriptor, read int64) *Error {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrDigestMismatch) || !errors.Is(err, content.ErrMismatchedDigest) {
		t.Fatalf("err = %v, want an *Error wrapping ErrDigestMismatch", err)
	}
	if e.Want != want.Digest || e.Size != want.Size || e.Read != read {
		t.Fatalf("error %+v, want digest %s size %d read %d", e, want.Digest, want.Size, read)
	}
	if !strings.Contains(err.Error(), "chunk "+want.Digest.String()) {
		t.Fatalf("message %q does not name the object", err)
	}
	return e
}

func TestReaderPassesGoodBytes(t *testing.T) {
	for _, data := range [][]byte{nil, []byte("x"), bytes.Repeat([]byte("0123456789"), 10000)} {
		for name, mk := range readers {
			vr := Reader(mk(data), "chunk", descOf(data))
			got, err := io.ReadAll(vr)
			if err != nil || !bytes.Equal(got, data) || !vr.Verified() {
				t.Fatalf("%s, %d bytes: read %d bytes, err %v, verified %v", name, len(data), len(got), err, vr.Verified())
			}
		}
	}
}

func TestReaderShortBody(t *testing.T) {
	data := []byte("hello, world")
	want := descOf(data)
	for name, mk := range readers {
		vr := Reader(mk(data[:5]), "chunk", want)
		_, err := io.ReadAll(vr)
		mismatch(t, err, want, 5)
		if vr.Verified() {
			t.Fatalf("%s: a short body counts as verified", name)
		}
	}
}

func TestReaderLongBody(t *testing.T) {
	data := []byte("hello, world")
	want := descOf(data)
	for name, mk := range readers {
		vr := Reader(mk(append(data, "and more"...)), "chunk", want)
		got, err := io.ReadAll(vr)
		mismatch(t, err, want, want.Size+1)
		if len(got) > len(data) {
			t.Fatalf("%s: passed on %d bytes, more than the descriptor's %d", name, len(got), len(data))
		}
	}
}

func TestReaderWrongDigest(t *testing.T) {
	data := []byte("hello, world")
	want := descOf([]byte("hello, World"))
	for name, mk := range readers {
		vr := Reader(mk(data), "chunk", want)
		_, err := io.ReadAll(vr)
		e := mismatch(t, err, want, want.Size)
		if e.Got != digest.FromBytes(data) {
			t.Fatalf("%s: got %s, want the digest of the bytes read", name, e.Got)
		}
		if _, again := vr.Read(make([]byte, 4)); again != err {
			t.Fatalf("%s: a read after the verdict returned %v, want the same error", name, again)
		}
	}
}

func TestReaderEmptyBlob(t *testing.T) {
	empty := descOf(nil)
	if b, err := ReadAll(strings.NewReader(""), "chunk", empty); err != nil || len(b) != 0 {
		t.Fatalf("empty blob: %q, %v", b, err)
	}
	_, err := ReadAll(strings.NewReader("x"), "chunk", empty)
	mismatch(t, err, empty, 1)
	// Zero bytes with another blob's digest are a mismatch, not a pass.
	wrong := ocispec.Descriptor{Digest: digest.FromString("x"), Size: 0}
	_, err = ReadAll(strings.NewReader(""), "chunk", wrong)
	mismatch(t, err, wrong, 0)
}

func TestInvalidDescriptor(t *testing.T) {
	for _, tc := range []struct {
		name string
		desc ocispec.Descriptor
		is   error
	}{
		{"malformed", ocispec.Descriptor{Digest: "sha256:zz", Size: 1}, digest.ErrDigestInvalidLength},
		{"no algorithm", ocispec.Descriptor{Digest: "abc", Size: 1}, digest.ErrDigestInvalidFormat},
		{"empty", ocispec.Descriptor{Size: 1}, digest.ErrDigestInvalidFormat},
		{"unknown algorithm", ocispec.Descriptor{Digest: "md5:d41d8cd98f00b204e9800998ecf8427e", Size: 0}, digest.ErrDigestUnsupported},
		{"negative size", ocispec.Descriptor{Digest: digest.FromString(""), Size: -1}, nil},
	} {
		_, err := ReadAll(strings.NewReader(""), "chunk", tc.desc)
		if err == nil || errors.Is(err, ErrDigestMismatch) || tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%s: ReadAll: %v, want an invalid-descriptor error (%v)", tc.name, err, tc.is)
		}
		if err := Bytes("chunk", nil, tc.desc); err == nil || errors.Is(err, ErrDigestMismatch) {
			t.Errorf("%s: Bytes: %v, want an invalid-descriptor error", tc.name, err)
		}
		if n, err := Reader(strings.NewReader("abc"), "chunk", tc.desc).Read(make([]byte, 3)); n != 0 || err == nil {
			t.Errorf("%s: Read: %d bytes, %v; want none and an error", tc.name, n, err)
		}
	}
}

func TestDigestSizes(t *testing.T) {
	data := []byte("0123456789")
	want := descOf(data)
	h := sha256.Sum256(data)
	got := digest.NewDigestFromBytes(digest.SHA256, h[:])
	for _, tc := range []struct {
		n, read int64
		ok      bool
	}{
		{10, 10, true}, {9, 9, false}, {0, 0, false}, {11, 11, false}, {1 << 40, 11, false},
	} {
		err := Digest("chunk", want, got, tc.n)
		if tc.ok {
			if err != nil {
				t.Fatalf("n=%d: %v", tc.n, err)
			}
			continue
		}
		e := mismatch(t, err, want, tc.read)
		if e.Got != "" {
			t.Fatalf("n=%d: a wrong size reports digest %s, want none", tc.n, e.Got)
		}
	}
	if err := Bytes("chunk", data[:9], want); err == nil {
		t.Fatal("Bytes accepted 9 of 10 bytes")
	} else {
		mismatch(t, err, want, 9)
	}
}

func TestEnd(t *testing.T) {
	data := []byte("0123456789")
	want := descOf(data)
	if err := End("chunk", want, strings.NewReader(""), want.Digest, want.Size); err != nil {
		t.Fatalf("drained body: %v", err)
	}
	mismatch(t, End("chunk", want, strings.NewReader("!"), want.Digest, want.Size), want, want.Size+1)
	mismatch(t, End("chunk", want, strings.NewReader(""), digest.FromString("x"), want.Size), want, want.Size)
}

func TestErrorMessages(t *testing.T) {
	d := digest.FromString("a")
	for _, tc := range []struct {
		e    Error
		want string
	}{
		{Error{What: "chunk", Want: d, Size: 4, Read: 2}, "chunk " + d.String() + ": content does not match its digest: 2 of 4 bytes"},
		{Error{What: "chunk", Want: d, Size: 4, Read: 5}, "more than 4 bytes"},
		{Error{Want: d, Size: 4, Read: 4, Got: digest.FromString("b")}, "content does not match its digest: got " + digest.FromString("b").String() + " (4 bytes)"},
	} {
		if msg := tc.e.Error(); !strings.Contains(msg, tc.want) || tc.e.What == "" && strings.Contains(msg, d.String()) {
			t.Errorf("message %q, want it to contain %q", msg, tc.want)
		}
	}
}

type fetcher map[digest.Digest][]byte

func (f fetcher) Fetch(_ context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	b, ok := f[desc.Digest]
	if !ok {
		return nil, errors.New("not found")
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func TestFetch(t *testing.T) {
	good, bad := []byte("good bytes"), []byte("bad bytes!")
	want := descOf(good)
	src := fetcher{want.Digest: good}
	if b, err := Fetch(context.Background(), src, "chunk", want); err != nil || !bytes.Equal(b, good) {
		t.Fatalf("fetch: %q, %v", b, err)
	}
	src[want.Digest] = bad
	_, err := Fetch(context.Background(), src, "chunk", want)
	mismatch(t, err, want, want.Size)
	if _, err := Fetch(context.Background(), src, "chunk", descOf([]byte("absent"))); err == nil || errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("fetch of an absent blob: %v, want the fetcher's error", err)
	}
}

func TestFetchTo(t *testing.T) {
	good, bad := []byte("good bytes"), []byte("bad bytes!")
	want := descOf(good)
	src := fetcher{want.Digest: good}
	var got []byte
	if err := FetchTo(context.Background(), src, "chunk", want, func(r io.Reader) { got, _ = io.ReadAll(r) }); err != nil || !bytes.Equal(got, good) {
		t.Fatalf("fetch: %q, %v", got, err)
	}
	// A reader that stops early still gets the verdict on every byte.
	src[want.Digest] = bad
	err := FetchTo(context.Background(), src, "chunk", want, func(r io.Reader) { r.Read(make([]byte, 2)) })
	mismatch(t, err, want, want.Size)
	src[want.Digest] = good[:4]
	if err := FetchTo(context.Background(), src, "chunk", want, func(io.Reader) {}); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("fetch of a short body: %v, want a mismatch", err)
	}
	if err := FetchTo(context.Background(), src, "chunk", descOf([]byte("absent")), func(io.Reader) { t.Error("read called") }); err == nil || errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("fetch of an absent blob: %v, want the fetcher's error", err)
	}
}

// TestChecked: a Checked vouches only for its own descriptor, serves its
// bytes as a reader and as the bytes themselves, and releases them once,
// at Close.
func TestChecked(t *testing.T) {
	b := []byte("verified bytes")
	desc := ocispec.Descriptor{Digest: digest.FromBytes(b), Size: int64(len(b))}
	released := 0
	c := NewChecked(b, desc, func() { released++ })
	if !c.Vouches(desc) || c.Vouches(ocispec.Descriptor{Digest: digest.FromString("other"), Size: desc.Size}) {
		t.Fatal("Vouches")
	}
	if &c.Bytes()[0] != &b[0] {
		t.Error("Bytes is a copy")
	}
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, b) || !bytes.Equal(c.Bytes(), b) {
		t.Fatalf("read %q, %v; Bytes %q after the read", got, err, c.Bytes())
	}
	c.Close()
	c.Close()
	if released != 1 || c.Bytes() != nil || c.Vouches(desc) {
		t.Errorf("after Close: released %d times, Bytes %q, vouches %v", released, c.Bytes(), c.Vouches(desc))
	}
}
