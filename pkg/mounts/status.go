package mounts

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/bdnvol/bdnvol/internal/proc"
)

// Status is a bdnvol mount on this machine as `bdnvol mounts` shows it.
type Status struct {
	Mountpoint string `json:"mountpoint"`
	Digest     string `json:"digest"`
	Reference  string `json:"reference,omitempty"` // as its state records it
	PID        int    `json:"pid,omitempty"`       // of the process serving it
	Stale      bool   `json:"stale"`               // nothing serves it any more
}

// Statuses returns every bdnvol mount on this machine with what its state
// records (when the state is of the same digest).
func (s Store) Statuses() ([]Status, error) {
	ms, err := List()
	if err != nil {
		return nil, err
	}
	return s.statuses(ms), nil
}

func (s Store) statuses(ms []Mount) []Status {
	out := []Status{}
	for _, m := range ms {
		o := Status{Mountpoint: m.Mountpoint, Digest: m.Digest}
		if st, ok := s.Read(m.Mountpoint); ok && st.Digest == m.Digest {
			o.Reference, o.PID = st.Reference, st.PID
		}
		o.Stale = NotConnected(m.Mountpoint) || (o.PID != 0 && !proc.Alive(o.PID, ""))
		out = append(out, o)
	}
	return out
}

// Targets returns the bdnvol mount at mp, else every one under mp (the root
// of a `mount --spec`); it fails when there is none.
func Targets(mp string) ([]Mount, error) {
	if m, ok := At(mp); ok {
		return []Mount{m}, nil
	}
	under, err := Under(mp)
	if err != nil {
		return nil, err
	}
	if len(under) == 0 {
		return nil, fmt.Errorf("%s: not a bdnvol mount", mp)
	}
	return under, nil
}

// DefaultStore is where mounts record their state:
// $XDG_RUNTIME_DIR/bdnvol/mounts, else mounts/ under cacheDir.
func DefaultStore(cacheDir string) Store {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return Store{Dir: filepath.Join(d, "bdnvol", "mounts")}
	}
	return Store{Dir: filepath.Join(cacheDir, "mounts")}
}
