package layout

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// synthIndex is a dataset-shaped index of n files of 1 KiB, 1,000 to a
// directory, packed 500 to a chunk, without any data.
func synthIndex(n int) *Index {
	x := &Index{Version: FormatVersion, Chunking: DefaultParams, Files: make([]File, 0, n+n/1000+1)}
	var seed [8]byte
	for d := 0; d*1000 < n; d++ {
		x.Files = append(x.Files, File{Path: fmt.Sprintf("shard-%05d", d), Type: TypeDir, Mode: 0o755})
		for i := d * 1000; i < min(n, (d+1)*1000); i++ {
			if i%500 == 0 {
				binary.BigEndian.PutUint64(seed[:], uint64(i))
				x.Chunks = append(x.Chunks, Chunk{Digest: digest.FromBytes(append([]byte("chunk"), seed[:]...)), Size: 500 << 10})
			}
			binary.BigEndian.PutUint64(seed[:], uint64(i))
			x.Files = append(x.Files, File{Path: fmt.Sprintf("shard-%05d/sample-%08d.jpg", d, i), Type: TypeFile, Mode: 0o644,
				Size: 1 << 10, Digest: digest.FromBytes(seed[:]), Extents: []Extent{{len(x.Chunks) - 1, int64(i%500) << 10, 1 << 10}}})
		}
	}
	return x
}

// dirFetcher reads blobs from dir/<hex>.
type dirFetcher string

func (d dirFetcher) Fetch(_ context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	return os.Open(filepath.Join(string(d), desc.Digest.Encoded()))
}

// writeSynthVersion seals synthIndex(n) into dir: its metadata blobs and a
// file "root" holding the root's descriptor fields.
func writeSynthVersion(tb testing.TB, dir string, n int) {
	s, err := Seal(synthIndex(n), 0, nil)
	if err != nil {
		tb.Fatal(err)
	}
	for _, bl := range append(append(s.Blobs, s.Parts...), s.Root) {
		if err := os.WriteFile(filepath.Join(dir, bl.Desc.Digest.Encoded()), bl.Data, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	root := fmt.Sprintf("%s %s %d", s.Root.Desc.MediaType, s.Root.Desc.Digest, s.Root.Desc.Size)
	if err := os.WriteFile(filepath.Join(dir, "root"), []byte(root), 0o644); err != nil {
		tb.Fatal(err)
	}
}

// procStatus returns a field of /proc/self/status in KiB (0 elsewhere).
func procStatus(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

// BenchmarkOpenRSS opens a sealed version of 10^5 and 10^6 small files in
// a fresh process and reports its peak RSS (what mount, pull, versions and
// inspect pay for the index) and the heap the opened version keeps.
func BenchmarkOpenRSS(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			dir := b.TempDir()
			writeSynthVersion(b, dir, n)
			b.ResetTimer()
			for range b.N {
				cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^BenchmarkOpenRSSChild$", "-test.benchtime=1x")
				cmd.Env = append(os.Environ(), "BDNVOL_OPEN_RSS_DIR="+dir)
				out, err := cmd.CombinedOutput()
				if err != nil {
					b.Fatalf("%v: %s", err, out)
				}
				var hwm, heap, secs float64
				i := bytes.Index(out, []byte("RSS "))
				if i < 0 {
					b.Fatalf("child said: %s", out)
				}
				fmt.Sscanf(string(out[i:]), "RSS %g %g %g", &hwm, &heap, &secs)
				b.ReportMetric(hwm/1024, "peak-RSS-MiB")
				b.ReportMetric(heap/(1<<20), "kept-heap-MiB")
				b.ReportMetric(secs, "open-s")
			}
		})
	}
}

// BenchmarkOpenRSSChild is BenchmarkOpenRSS's fresh process.
func BenchmarkOpenRSSChild(b *testing.B) {
	dir := os.Getenv("BDNVOL_OPEN_RSS_DIR")
	if dir == "" {
		b.Skip("run by BenchmarkOpenRSS")
	}
	rb, err := os.ReadFile(filepath.Join(dir, "root"))
	if err != nil {
		b.Fatal(err)
	}
	var desc ocispec.Descriptor
	var d string
	fmt.Sscanf(string(rb), "%s %s %d", &desc.MediaType, &d, &desc.Size)
	desc.Digest = digest.Digest(d)
	start := testingNow()
	v, err := Open(context.Background(), dirFetcher(dir), desc)
	if err != nil {
		b.Fatal(err)
	}
	secs := testingNow().Sub(start).Seconds()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("RSS %d %d %g\n", procStatus("VmHWM"), ms.HeapAlloc, secs)
	runtime.KeepAlive(v)
}

var testingNow = time.Now
