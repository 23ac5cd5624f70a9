package mounts

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
)

// State is what a running mount records about itself, so that other
// processes can find its reference and its serving process.
type State struct {
	Mountpoint string    `json:"mountpoint"`
	Reference  string    `json:"reference"`
	Digest     string    `json:"digest"`
	PID        int       `json:"pid"`
	CacheDir   string    `json:"cache_dir"`
	Started    time.Time `json:"started"`
}

// Store is a directory of state files, one per mountpoint.
type Store struct {
	Dir string
}

// Key names the files of mountpoint mp in the store.
func Key(mp string) string {
	h := sha256.Sum256([]byte(mp))
	return hex.EncodeToString(h[:8])
}

// Path is the state file of mp.
func (s Store) Path(mp string) string { return filepath.Join(s.Dir, Key(mp)+".json") }

// LogPath is the log file of a daemon serving mp.
func (s Store) LogPath(mp string) string { return filepath.Join(s.Dir, Key(mp)+".log") }

// Write records st, replacing any earlier state of its mountpoint atomically.
func (s Store) Write(st State) error {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return fmt.Errorf("mount state of %s: %w", st.Mountpoint, err)
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	p := s.Path(st.Mountpoint)
	if err := atomicfile.WriteFile(p, b, 0o644); err != nil {
		return fmt.Errorf("mount state of %s: %w", st.Mountpoint, err)
	}
	return nil
}

// Read returns the state recorded for mp; false when there is none, or it
// is unreadable, or it belongs to another mountpoint.
func (s Store) Read(mp string) (State, bool) {
	var st State
	b, err := os.ReadFile(s.Path(mp))
	if err != nil || json.Unmarshal(b, &st) != nil || st.Mountpoint != mp {
		return State{}, false
	}
	return st, true
}

// Remove removes the state of mp if it belongs to pid (0: whoever wrote it).
func (s Store) Remove(mp string, pid int) {
	if st, ok := s.Read(mp); ok && (pid == 0 || st.PID == pid) {
		os.Remove(s.Path(mp))
	}
}
