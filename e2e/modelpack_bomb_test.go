package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"os"
	"testing"
	"time"
)

// tarHeader is the 512-byte tar header of a regular file name claiming
// size bytes.
func tarHeader(t testing.TB, name string, size int64) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
		t.Fatal(err)
	}
	tw.Flush() // the header, without the size's data or the end of archive
	return b.Bytes()
}

// zstdBomb writes a zstd frame by hand (RFC 8878): a raw block holding
// prefix, then rle blocks of 128 KiB of zeros each, 4 bytes apiece, so
// that a layer of about 4*rle bytes expands to rle*128 KiB.
func zstdBomb(prefix []byte, rle int) []byte {
	out := binary.LittleEndian.AppendUint32(nil, 0xFD2FB528)
	out = append(out, 0x00, 7<<3) // no content size, no checksum; window 2^17
	block := func(last bool, typ, size uint32) {
		h := size<<3 | typ<<1
		if last {
			h |= 1
		}
		out = append(out, byte(h), byte(h>>8), byte(h>>16))
	}
	block(false, 0, uint32(len(prefix)))
	out = append(out, prefix...)
	for i := range rle {
		block(i == rle-1, 1, 128<<10)
		out = append(out, 0)
	}
	return out
}

// gzipBomb is a gzip stream of prefix and then zeros, made of one member
// of prefix and 64 MiB of zeros followed by copies of a member of 64 MiB
// of zeros: about 1 KiB of input per MiB of output.
func gzipBomb(t testing.TB, prefix []byte, members int) []byte {
	t.Helper()
	zeros := make([]byte, 64<<20)
	member := func(p []byte) []byte {
		var b bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
		zw.Write(p)
		zw.Write(zeros)
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	out := member(prefix)
	z := member(nil)
	for range members - 1 {
		out = append(out, z...)
	}
	return out
}

// TestModelPackBombs pulls and mounts models whose compressed tar layers
// are bombs: a 64 KiB +zstd layer that expands to 2 GiB (past the bound of
// 1024x its size plus 1 GiB) under a tar member claiming 1 TiB, and a 1 MiB
// +gzip layer that expands to 1 GiB under a member claiming 1 TiB (gzip
// cannot pass the bound: deflate gives at most about 1032x). Each fails
// with one clear line, within bounded memory (the CLI's peak RSS), with
// nothing written outside the target and no file of the bomb left in it.
func TestModelPackBombs(t *testing.T) {
	reg := newDistribution(t)
	tg := target{name: "distribution", reg: reg}
	hdr := tarHeader(t, "weights/huge.bin", 1<<40)
	cases := []struct {
		name, packing string
		blob          []byte
		mentions      []string
	}{
		{"zstd", "tar+zstd", zstdBomb(hdr, 16384), []string{"tar bomb"}},
		{"gzip", "tar+gzip", gzipBomb(t, hdr, 16), []string{"claims 1099511627776 bytes, and the layer ends after"}},
	}
	const rssLimit = 512 << 20
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := newModel(t, nil,
				mpLayer{mpType("weight", c.packing), c.blob, "weights"},
				mpLayer{mpType("doc", "raw"), []byte("# bomb\n"), "README.md"})
			ref := m.push(t, tg, "mp/bomb", "b"+string(rune('a'+i)))
			site := newPullSite(t)
			t0 := time.Now()
			res := runFor(t, "", 5*time.Minute, "pull", ref, site.dst)
			line := site.checkFailedPull(t, res, m.digest, c.mentions, nil)
			t.Logf("%s bomb: a %d-byte layer; pull failed in %v, peak RSS %d MiB: %s", c.name, len(c.blob), time.Since(t0).Round(time.Millisecond), res.maxRSS>>20, line)
			if res.maxRSS == 0 || res.maxRSS > rssLimit {
				t.Errorf("pull of a %s bomb: peak RSS %d MiB, want at most %d MiB", c.name, res.maxRSS>>20, rssLimit>>20)
			}
			if _, err := os.Lstat(site.dst); err == nil {
				for p, e := range snapshot(t, site.dst) {
					if e.Type == "file" {
						t.Errorf("the failed pull left %s in DIR", p)
					}
				}
			}
			res = run(t, "inspect", ref)
			if res.code != 1 || len(res.stderr) == 0 {
				t.Errorf("inspect of a %s bomb: exit %d, want 1 with an error:\n%s", c.name, res.code, res)
			}
		})
	}
}
