package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// edgeBytes is the format's edge length (docs/format.md).
const edgeBytes = 256 << 10

// TestMountTensorNeighboursFromEdges reads one tensor through a FUSE mount.
// The kernel reads whole pages, so the first and last page are shared with
// the neighbouring tensors, whose chunks are 4 MiB here: those pages must
// come from the neighbours' verified 256 KiB edges, fetched by range, so
// the registry sends the tensor's chunks and two edges, not four chunks.
func TestMountTensorNeighboursFromEdges(t *testing.T) {
	const mib = 1 << 20
	sizes := []int{9*mib + 1234, 10*mib + 777, 9*mib + 99}
	file, begins := safetensorsFile(3, sizes...)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "model.safetensors"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	forTargets(t, func(t *testing.T, tg target) {
		ref := tg.repo("edges") + ":v1"
		push(t, tg.repo("edges"), ref, src, "--chunk-min", "1MiB", "--chunk-avg", "2MiB", "--chunk-max", "4MiB")
		// With read(2), and through a memory map as safetensors loaders
		// read (page faults, with the kernel's read-around).
		for _, how := range []string{"read", "mmap"} {
			t.Run(how, func(t *testing.T) {
				if tg.reg != nil {
					tg.reg.ResetStats()
				}
				mp := mount(t, ref, "--prefetch", "none", "--cache-dir", t.TempDir())
				f, err := os.Open(filepath.Join(mp, "model.safetensors"))
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				mid := sizes[1]
				want := file[begins[1] : begins[1]+int64(mid)]
				var before int64
				settled := func() {
					time.Sleep(200 * time.Millisecond) // let readahead of the header settle
					if tg.reg != nil {
						before = tg.reg.Stats().BlobBytesOut
					}
				}
				if how == "read" {
					if _, err := f.ReadAt(make([]byte, begins[0]), 0); err != nil {
						t.Fatal(err)
					}
					settled()
					got := make([]byte, mid)
					if _, err := f.ReadAt(got, begins[1]); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, want) {
						t.Fatal("the tensor read through the mount differs from the file")
					}
				} else {
					// Page faults must come from another process: this one
					// serves the registry, and a thread stuck in a fault
					// would stall its garbage collector, and the registry.
					sum := mmapRead(t, filepath.Join(mp, "model.safetensors"), begins[0], begins[1], int64(mid), settled)
					if sum != fmt.Sprintf("%x", sha256.Sum256(want)) {
						t.Fatal("the tensor read through a memory map of the mount differs from the file")
					}
				}
				if tg.reg == nil {
					return
				}
				time.Sleep(300 * time.Millisecond) // count readahead too
				st := tg.reg.Stats()
				fetched := st.BlobBytesOut - before
				// The tensor's chunks, the two edges, and nothing else. A
				// memory map's read-around of the first fault also reaches
				// into the tensor's first chunk before the tensor is seen to
				// start, and may take its head as an edge first: allow two
				// more edges there, still far less than the neighbouring
				// chunks (4 MiB and 1 MiB here).
				limit := int64(mid) + 2*edgeBytes
				if how == "mmap" {
					limit += 2 * edgeBytes
				}
				t.Logf("%s, %s: a tensor of %d bytes fetched %d bytes", tg.name, how, mid, fetched)
				if fetched > limit {
					t.Fatalf("reading a tensor of %d bytes (%s) fetched %d bytes from %s, more than the tensor and two edges (%d)", mid, how, fetched, tg.name, limit)
				}
			})
		}
	})
}

// mmapReaderEnv makes the test binary a memory-map reader (see mmapReader).
const mmapReaderEnv = "BDNVOL_E2E_MMAP_READER"

// mmapRead runs the test binary as a reader that maps path, reads its
// first hdr bytes, waits until settled has run here, reads n bytes at off
// and returns their SHA-256.
func mmapRead(t *testing.T, path string, hdr, off, n int64, settled func()) string {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d,%d", mmapReaderEnv, path, hdr, off, n))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	out := bufio.NewReader(stdout)
	if line, err := out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "header" {
		t.Fatalf("mmap reader: %q %v\n%s", line, err, stderr.String())
	}
	settled()
	io.WriteString(stdin, "go\n")
	line, err := out.ReadString('\n')
	if err != nil {
		cmd.Wait()
		t.Fatalf("mmap reader: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(line)
}

// mmapReader is the reader process of mmapRead; spec is path,hdr,off,n.
func mmapReader(spec string) int {
	parts := strings.Split(spec, ",")
	if len(parts) != 4 {
		return 2
	}
	var hdr, off, n int64
	fmt.Sscan(parts[1], &hdr)
	fmt.Sscan(parts[2], &off)
	fmt.Sscan(parts[3], &n)
	f, err := os.Open(parts[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st, err := f.Stat()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	buf := make([]byte, max(n, hdr))
	copy(buf[:hdr], m) // the header, by page faults
	fmt.Println("header")
	bufio.NewReader(os.Stdin).ReadString('\n')
	copy(buf[:n], m[off:off+n])
	fmt.Printf("%x\n", sha256.Sum256(buf[:n]))
	return 0
}

// safetensorsFile returns a safetensors file holding tensors of the given
// sizes, with random contents from seed, and where each tensor starts.
func safetensorsFile(seed uint64, sizes ...int) ([]byte, []int64) {
	hdr := map[string]any{}
	off := 0
	for i, n := range sizes {
		hdr[fmt.Sprintf("t%d", i)] = map[string]any{"dtype": "U8", "shape": []int{n}, "data_offsets": []int{off, off + n}}
		off += n
	}
	h, _ := json.Marshal(hdr)
	for (8+len(h))%8 != 0 {
		h = append(h, ' ')
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	b = append(b, h...)
	data := make([]byte, off)
	r := rand.New(rand.NewPCG(seed, seed+1))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	begins := make([]int64, len(sizes))
	at := int64(len(b))
	for i, n := range sizes {
		begins[i] = at
		at += int64(n)
	}
	return append(b, data...), begins
}
