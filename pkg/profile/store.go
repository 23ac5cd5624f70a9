package profile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
	"github.com/bdnvol/bdnvol/internal/bounded"
)

// Store is the profiles kept on a node, one file per version, in Dir
// (next to the node's chunk cache).
type Store struct{ Dir string }

// StoreIn returns the store of the chunk cache in directory cacheDir.
func StoreIn(cacheDir string) Store { return Store{Dir: filepath.Join(cacheDir, "profiles")} }

// Path returns the file of version v's profile.
func (s Store) Path(v digest.Digest) string { return filepath.Join(s.Dir, v.Encoded()+".json") }

// Save stores p as the profile of its version, replacing any before it.
func (s Store) Save(p *Profile) error {
	if err := checkDigest(p.Version); err != nil {
		return fmt.Errorf("%w: version: %v", ErrInvalid, err)
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return err
	}
	return atomicfile.WriteFile(s.Path(p.Version), p.Encode(), 0o644)
}

// Load returns the stored profile of version v: ErrNotFound when there is
// none, ErrOtherVersion when the file holds another version's.
func (s Store) Load(v digest.Digest) (*Profile, error) {
	if err := checkDigest(v); err != nil {
		return nil, err
	}
	p, err := ReadFile(s.Path(v))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", v, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if p.Version != v {
		return nil, fmt.Errorf("%s: %w", s.Path(v), ErrOtherVersion)
	}
	return p, nil
}

// ReadFile reads and parses the profile document in file name, reading no
// more than MaxBytes+1 bytes of it (a FIFO or standard input too).
func ReadFile(name string) (*Profile, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := bounded.Read(f, MaxBytes)
	if errors.Is(err, bounded.ErrTooLarge) {
		return nil, fmt.Errorf("%s: %w: %v", name, ErrInvalid, err)
	}
	if err != nil {
		return nil, err
	}
	p, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return p, nil
}
