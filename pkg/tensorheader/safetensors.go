package tensorheader

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
)

// maxSafetensorsHeader bounds the JSON header a safetensors file may declare.
const maxSafetensorsHeader = 100 << 20

// SafetensorsHeaderLimit is the longest safetensors header that readers of
// a sealed version (mount, diff --tensors) parse. The format allows 100 MB,
// but a header costs about 100 bytes per tensor, so real checkpoints stay
// far below: shards of the largest public models list a few thousand
// tensors (well under 1 MiB of header). 16 MiB leaves room for some
// 150,000 tensors in one file.
const SafetensorsHeaderLimit = 16 << 20

// Tensor is one tensor of a safetensors file: its name and byte range
// relative to the start of the file.
type Tensor struct {
	Name       string
	Begin, End int64
}

// ReadSafetensorsHeader parses the header of a safetensors file of the given
// size and returns the header length (including the 8-byte prefix) and its
// tensors sorted by offset. It rejects overlapping or out-of-range tensors.
func ReadSafetensorsHeader(r io.ReaderAt, size int64) (int64, []Tensor, error) {
	return ReadSafetensorsHeaderMax(r, size, maxSafetensorsHeader)
}

// SafetensorsHeaderLen returns the length of the JSON header a safetensors
// file of the given size declares in its 8-byte prefix, checked against the
// file's size and the format's limit.
func SafetensorsHeaderLen(r io.ReaderAt, size int64) (int64, error) {
	var pre [8]byte
	if size < 8 {
		return 0, fmt.Errorf("safetensors: file of %d bytes is too short", size)
	}
	if _, err := r.ReadAt(pre[:], 0); err != nil {
		return 0, fmt.Errorf("safetensors: %w", err)
	}
	n := binary.LittleEndian.Uint64(pre[:])
	if n > maxSafetensorsHeader || int64(n) > size-8 {
		return 0, fmt.Errorf("safetensors: header of %d bytes does not fit a %d byte file", n, size)
	}
	return int64(n), nil
}

// ErrHeaderTooLarge is wrapped when a safetensors header is longer than the
// reader accepts.
var ErrHeaderTooLarge = errors.New("safetensors: header too large")

// headerPiece is how much of a header is read at a time: memory grows with
// the bytes that arrived, not with the length the prefix declares.
const headerPiece = 1 << 20

// ReadSafetensorsHeaderMax is ReadSafetensorsHeader for headers of at most
// max bytes; a longer one is an error wrapping ErrHeaderTooLarge.
func ReadSafetensorsHeaderMax(r io.ReaderAt, size, max int64) (int64, []Tensor, error) {
	buf, err := ReadSafetensorsHeaderBytes(r, size, max)
	if err != nil {
		return 0, nil, err
	}
	return ParseSafetensorsHeader(buf, size)
}

// ReadSafetensorsHeaderBytes returns the JSON header (without its 8-byte
// prefix) of a safetensors file of the given size, of at most max bytes (a
// longer one is an error wrapping ErrHeaderTooLarge, before any of it is
// read), reading it a piece at a time: memory grows with the bytes that
// arrive, not with the length the prefix declares.
func ReadSafetensorsHeaderBytes(r io.ReaderAt, size, max int64) ([]byte, error) {
	n, err := SafetensorsHeaderLen(r, size)
	if err != nil {
		return nil, err
	}
	if n > max {
		return nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrHeaderTooLarge, n, max)
	}
	var buf []byte
	for int64(len(buf)) < n {
		k := int(min(headerPiece, n-int64(len(buf))))
		buf = slices.Grow(buf, k)
		m, err := r.ReadAt(buf[len(buf):len(buf)+k], 8+int64(len(buf)))
		buf = buf[:len(buf)+m]
		if m < k {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("safetensors: header: %w", err)
		}
	}
	return buf, nil
}

// ParseSafetensorsHeader parses the JSON header of a safetensors file of the
// given total size (hdr excludes the 8-byte length prefix).
func ParseSafetensorsHeader(hdr []byte, size int64) (int64, []Tensor, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil {
		return 0, nil, fmt.Errorf("safetensors: header: %w", err)
	}
	start := 8 + int64(len(hdr))
	data := size - start
	ts := make([]Tensor, 0, len(raw))
	for name, msg := range raw {
		if name == "__metadata__" {
			continue
		}
		var t struct {
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &t); err != nil {
			return 0, nil, fmt.Errorf("safetensors: tensor %q: %w", name, err)
		}
		if len(t.Offsets) != 2 || t.Offsets[0] < 0 || t.Offsets[1] < t.Offsets[0] || t.Offsets[1] > data {
			return 0, nil, fmt.Errorf("safetensors: tensor %q: bad data_offsets %v", name, t.Offsets)
		}
		ts = append(ts, Tensor{Name: name, Begin: start + t.Offsets[0], End: start + t.Offsets[1]})
	}
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].Begin != ts[j].Begin {
			return ts[i].Begin < ts[j].Begin
		}
		return ts[i].End < ts[j].End
	})
	for i := 1; i < len(ts); i++ {
		if ts[i].Begin < ts[i-1].End {
			return 0, nil, fmt.Errorf("safetensors: tensors %q and %q overlap", ts[i-1].Name, ts[i].Name)
		}
	}
	return start, ts, nil
}

// IsSafetensors reports whether a path names a safetensors file.
func IsSafetensors(p string) bool { return strings.HasSuffix(p, ".safetensors") }
