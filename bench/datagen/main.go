// Command datagen writes a dataset-shaped tree for the bench: many small
// files of pseudo-random bytes spread over directories.
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
)

func main() {
	out := flag.String("out", "", "directory to write (created)")
	files := flag.Int("files", 100000, "number of files")
	dirs := flag.Int("dirs", 100, "number of directories")
	size := flag.Int("size", 1024, "bytes per file")
	seed := flag.Uint64("seed", 18, "random seed")
	only := flag.Int("only-dir", -1, "write only the files of this directory (rewriting them), with bytes from -seed")
	flag.Parse()
	if *out == "" || *files < 1 || *dirs < 1 || *size < 0 || *only >= *dirs {
		fmt.Fprintln(os.Stderr, "usage: datagen -out DIR [-files N] [-dirs D] [-size BYTES] [-seed S] [-only-dir D]")
		os.Exit(2)
	}
	if err := write(*out, *files, *dirs, *size, *seed, *only); err != nil {
		fmt.Fprintln(os.Stderr, "datagen:", err)
		os.Exit(1)
	}
}

// write writes the files (only those of directory only, if it is not -1).
func write(out string, files, dirs, size int, seed uint64, only int) error {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for d := range dirs {
		if err := os.MkdirAll(filepath.Join(out, fmt.Sprintf("d%04d", d)), 0o755); err != nil {
			return err
		}
	}
	buf := make([]byte, size+8)
	for i := range files {
		if only >= 0 && i%dirs != only {
			continue
		}
		for k := 0; k < size; k += 8 {
			v := r.Uint64()
			for j := range 8 {
				buf[k+j] = byte(v >> (8 * j))
			}
		}
		p := filepath.Join(out, fmt.Sprintf("d%04d", i%dirs), fmt.Sprintf("f%08d.bin", i))
		if err := os.WriteFile(p, buf[:size], 0o644); err != nil {
			return err
		}
	}
	return nil
}
