package mounts

import (
	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/proc"
)

// Serving is a bdnvol mount whose server is alive.
type Serving struct {
	Mountpoint string
	Reference  string        // as the mount recorded it, else the digest
	Digest     digest.Digest // the version served
}

// Serving returns the bdnvol mounts on this machine whose server is alive;
// nil when the mount table cannot be read.
func (s Store) Serving() []Serving {
	ms, err := List()
	if err != nil {
		return nil
	}
	return s.serving(ms)
}

// serving keeps the mounts of ms that are not stale: connected, and not
// recorded by a server that is gone.
func (s Store) serving(ms []Mount) []Serving {
	var out []Serving
	for _, m := range ms {
		st, ok := s.Read(m.Mountpoint)
		if NotConnected(m.Mountpoint) || ok && st.Digest == m.Digest && st.PID != 0 && !proc.Alive(st.PID, "") {
			continue // stale: nothing is served from it
		}
		d, err := digest.Parse(m.Digest)
		if err != nil {
			continue
		}
		r := Serving{Mountpoint: m.Mountpoint, Reference: m.Digest, Digest: d}
		if ok && st.Digest == m.Digest {
			r.Reference = st.Reference
		}
		out = append(out, r)
	}
	return out
}
