package chunkcache

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/opencontainers/go-digest"
)

// failingWriter fails once it has taken limit bytes.
type failingWriter struct {
	bytes.Buffer
	limit int
}

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.Len()+len(p) > w.limit {
		return 0, errors.New("no space left on device")
	}
	return w.Buffer.Write(p)
}

func TestCopyHashed(t *testing.T) {
	data := randBytes(5, 3*piece+12345)
	var out bytes.Buffer
	n, got, err := copyHashed(&out, bytes.NewReader(data), int64(len(data)))
	if err != nil || n != int64(len(data)) || got != digest.FromBytes(data) || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("copy: n %d, digest %s, err %v, equal %v", n, got, err, bytes.Equal(out.Bytes(), data))
	}
	// A body that ends early.
	_, _, err = copyHashed(io.Discard, bytes.NewReader(data[:piece+7]), int64(len(data)))
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body: %v", err)
	}
	// A body that ends early on a piece boundary.
	_, _, err = copyHashed(io.Discard, bytes.NewReader(data[:2*piece]), int64(len(data)))
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body on a piece boundary: %v", err)
	}
	// A write that fails half-way is a store error, not a bad blob.
	_, _, err = copyHashed(&failingWriter{limit: 2 * piece}, bytes.NewReader(data), int64(len(data)))
	var se *storeError
	if !errors.As(err, &se) {
		t.Fatalf("failing write: %v", err)
	}
	// A body longer than size is read only up to size.
	r := bytes.NewReader(append(bytes.Clone(data), 1, 2, 3))
	if _, _, err := copyHashed(io.Discard, r, int64(len(data))); err != nil || r.Len() != 3 {
		t.Fatalf("long body: err %v, %d bytes left unread", err, r.Len())
	}
}
