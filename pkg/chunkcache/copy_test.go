package chunkcache

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/sha2x"
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
	n, got, err := copyHashed(&out, bytes.NewReader(data), int64(len(data)), nil)
	if err != nil || n != int64(len(data)) || got != digest.FromBytes(data) || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("copy: n %d, digest %s, err %v, equal %v", n, got, err, bytes.Equal(out.Bytes(), data))
	}
	// A body that ends early.
	_, _, err = copyHashed(io.Discard, bytes.NewReader(data[:piece+7]), int64(len(data)), nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body: %v", err)
	}
	// A body that ends early on a piece boundary.
	_, _, err = copyHashed(io.Discard, bytes.NewReader(data[:2*piece]), int64(len(data)), nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body on a piece boundary: %v", err)
	}
	// A write that fails half-way is a store error, not a bad blob.
	_, _, err = copyHashed(&failingWriter{limit: 2 * piece}, bytes.NewReader(data), int64(len(data)), nil)
	var se *storeError
	if !errors.As(err, &se) {
		t.Fatalf("failing write: %v", err)
	}
	// A body longer than size is read only up to size.
	r := bytes.NewReader(append(bytes.Clone(data), 1, 2, 3))
	if _, _, err := copyHashed(io.Discard, r, int64(len(data)), nil); err != nil || r.Len() != 3 {
		t.Fatalf("long body: err %v, %d bytes left unread", err, r.Len())
	}
}

// TestCopyHashedInPairs: a fetch's pieces are offered to the cache's
// pairer, so a stream waiting there (another fetch) is hashed beside the
// first piece; both digests come out right. Without SHA extensions an
// offer is hashed at once and nothing pairs: then only digests are checked.
func TestCopyHashedInPairs(t *testing.T) {
	data := randBytes(6, 3*piece+99)
	var pairs sha2x.Pairer
	other := sha2x.NewDigest()
	waiting := randBytes(7, piece)
	o := pairs.Offer(other, waiting)
	var out bytes.Buffer
	n, got, err := copyHashed(&out, bytes.NewReader(data), int64(len(data)), &pairs)
	if err != nil || n != int64(len(data)) || got != digest.FromBytes(data) || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("copy: n %d, digest %s, err %v, equal %v", n, got, err, bytes.Equal(out.Bytes(), data))
	}
	pairs.Collect(o)
	if got, want := digest.NewDigest(digest.SHA256, other), digest.FromBytes(waiting); got != want {
		t.Errorf("the waiting stream hashed to %s, want %s", got, want)
	}
	if o != nil && pairs.Paired() < 1 {
		t.Errorf("no offer hashed in pairs: the copy did not take the waiting stream")
	}
	// Two copies at once: both right.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := randBytes(uint64(20+i), 2*piece+i*1000)
			var out bytes.Buffer
			_, got, err := copyHashed(&out, bytes.NewReader(b), int64(len(b)), &pairs)
			if err == nil && (got != digest.FromBytes(b) || !bytes.Equal(out.Bytes(), b)) {
				err = errors.New("wrong digest or bytes")
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("copy %d: %v", i, err)
		}
	}
}
