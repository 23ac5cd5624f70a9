// Package atomicfile replaces a file whole: a reader, or the file after a
// crash, has the old bytes or the new ones, never a part.
package atomicfile

import (
	"bufio"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFile replaces path with b and mode perm: it writes a temporary file
// in path's directory, syncs it and renames it over path. On failure path
// is as it was and the temporary file is gone.
func WriteFile(path string, b []byte, perm fs.FileMode) (err error) {
	return Write(path, perm, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
}

// Write is WriteFile with the bytes written by write, through a buffer,
// so they need not all be in memory at once.
func Write(path string, perm fs.FileMode, write func(w io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err = write(bw); err != nil {
		return err
	}
	if err = bw.Flush(); err != nil {
		return err
	}
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
