// Command loader reads a model directory the way a model server's loader
// does, for bench/profile.sh: every other file whole, then each
// safetensors file in name order: its header, then every tensor in header
// order, with read(2) or through mmap, optionally pausing after each
// tensor (compute). It prints one JSON line: files, tensors, bytes,
// seconds.
package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// tensor is one tensor's byte range in a safetensors file's data section.
type tensor struct {
	name       string
	begin, end int64
}

// trace, when set, gets a line per tensor read (-trace).
var trace io.Writer

// traced writes tensor t of shard p's line to trace: read from t0 to now.
func traced(p string, t tensor, t0 time.Time) {
	if trace != nil {
		fmt.Fprintf(trace, "%s %s %d %d %d\n", filepath.Base(p), t.name, t.end-t.begin, t0.UnixNano(), time.Now().UnixNano())
	}
}

// sink keeps the bytes an mmap load touches from being optimised away.
var sink byte

// maxHeader bounds the header the loader reads.
const maxHeader = 100 << 20

func main() {
	mode := flag.String("mode", "read", "read (pread each tensor) or mmap (touch every page of each tensor)")
	pause := flag.Duration("pause", 0, "pause after each tensor (compute)")
	tracePath := flag.String("trace", "", "write a line per tensor to this file: shard, tensor, bytes, and when its read began and ended (ns since the epoch)")
	flag.Parse()
	if *tracePath != "" {
		f, err := os.Create(*tracePath)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loader:", err)
			os.Exit(1)
		}
		defer f.Close()
		trace = f
	}
	if flag.NArg() != 1 || (*mode != "read" && *mode != "mmap") {
		fmt.Fprintln(os.Stderr, "usage: loader [-mode read|mmap] [-pause D] DIR")
		os.Exit(2)
	}
	start := time.Now()
	st, err := load(flag.Arg(0), *mode, *pause)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loader:", err)
		os.Exit(1)
	}
	st.Seconds = time.Since(start).Seconds()
	st.RunqMS = runqMS()
	json.NewEncoder(os.Stdout).Encode(st)
}

// stats is what a load read.
type stats struct {
	Files   int     `json:"files"`
	Tensors int     `json:"tensors"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	// RunqMS is how long the loader's threads were runnable but not
	// running (waiting for a CPU), from /proc/self/task/*/schedstat.
	RunqMS float64 `json:"runq_ms"`
}

// runqMS sums the run-queue wait of the process's threads, in ms (0 where
// /proc does not say).
func runqMS() float64 {
	paths, _ := filepath.Glob("/proc/self/task/*/schedstat")
	var ns float64
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var run, wait float64
		if _, err := fmt.Sscan(string(b), &run, &wait); err == nil {
			ns += wait
		}
	}
	return ns / 1e6
}

func load(dir, mode string, pause time.Duration) (stats, error) {
	var st stats
	var shards, others []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		if strings.HasSuffix(p, ".safetensors") {
			shards = append(shards, p)
		} else {
			others = append(others, p)
		}
		return nil
	})
	if err != nil {
		return st, err
	}
	sort.Strings(shards)
	for _, p := range others {
		b, err := os.ReadFile(p)
		if err != nil {
			return st, err
		}
		st.Files++
		st.Bytes += int64(len(b))
	}
	for _, p := range shards {
		n, b, err := loadShard(p, mode, pause)
		if err != nil {
			return st, fmt.Errorf("%s: %w", p, err)
		}
		st.Files++
		st.Tensors += n
		st.Bytes += b
	}
	return st, nil
}

// loadShard reads the header of the safetensors file p and then its
// tensors in header order; it returns the tensors and bytes read.
func loadShard(p, mode string, pause time.Duration) (int, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	var n [8]byte
	if _, err := f.ReadAt(n[:], 0); err != nil {
		return 0, 0, err
	}
	hl := binary.LittleEndian.Uint64(n[:])
	if hl > maxHeader {
		return 0, 0, fmt.Errorf("header of %d bytes", hl)
	}
	hdr := make([]byte, hl)
	if _, err := f.ReadAt(hdr, 8); err != nil {
		return 0, 0, err
	}
	ts, err := tensors(hdr)
	if err != nil {
		return 0, 0, err
	}
	base := 8 + int64(hl)
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	read := int64(8 + hl)
	if mode == "mmap" {
		m, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
		if err != nil {
			return 0, 0, err
		}
		defer syscall.Munmap(m)
		var sum byte
		for _, t := range ts {
			t0 := time.Now()
			for off := base + t.begin; off < base+t.end; off += 4096 {
				sum += m[off]
			}
			traced(p, t, t0)
			read += t.end - t.begin
			time.Sleep(pause)
		}
		sink += sum
		return len(ts), read, nil
	}
	buf := make([]byte, 0)
	for _, t := range ts {
		size := t.end - t.begin
		if int64(cap(buf)) < size {
			buf = make([]byte, size)
		}
		t0 := time.Now()
		if _, err := f.ReadAt(buf[:size], base+t.begin); err != nil && !errors.Is(err, io.EOF) {
			return 0, 0, fmt.Errorf("tensor %s: %w", t.name, err)
		}
		traced(p, t, t0)
		read += size
		time.Sleep(pause)
	}
	return len(ts), read, nil
}

// tensors returns the tensors of a safetensors header in the order the
// header lists them.
func tensors(hdr []byte) ([]tensor, error) {
	dec := json.NewDecoder(bytes.NewReader(hdr))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("header is not a JSON object")
	}
	var out []tensor
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v struct {
			Offsets []int64 `json:"data_offsets"`
		}
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if k == "__metadata__" {
			continue
		}
		if len(v.Offsets) != 2 || v.Offsets[0] < 0 || v.Offsets[1] < v.Offsets[0] {
			return nil, fmt.Errorf("tensor %v: bad data_offsets", k)
		}
		out = append(out, tensor{name: fmt.Sprint(k), begin: v.Offsets[0], end: v.Offsets[1]})
	}
	return out, nil
}
