package pull

import (
	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// samePieces marks the entries of x that are in an index piece whose
// digest is in prev (the pieces the last whole pull here wrote): a piece
// with the same digest lists the same entries, with the same digests and
// chunks. It returns nil when none is, or when use is false (a partial
// pull looks at every file it selects).
func samePieces(x *layout.Index, prev map[digest.Digest]bool, use bool) []bool {
	if !use || len(prev) == 0 {
		return nil
	}
	var out []bool
	start := 0
	for _, pc := range x.Pieces() {
		end := start + int(pc.Entries)
		if prev[pc.Digest] && end <= x.Len() {
			if out == nil {
				out = make([]bool, x.Len())
			}
			for i := start; i < end; i++ {
				out[i] = true
			}
		}
		start = end
	}
	return out
}

// keepUnlooked keeps f, an entry of a piece the last whole pull here wrote
// as it is, without a look at the file: the record that pull saved of it
// stands for it again. It reports false (the file is then looked at as
// any other) when there is no such record, or one that cannot vouch.
func (p *puller) keepUnlooked(f *layout.File) bool {
	rec, ok := p.previous.Get(f.Path)
	if !ok || rec.Racy || rec.Stat.Size != f.Size || (rec.Unverified && len(rec.Extents) == 0) {
		return false
	}
	p.opt.StatCache.StorePulled(p.x, f.Path, rec.Stat, rec.Extents != nil, !rec.Unverified)
	p.res.FilesReused++
	p.res.FilesUnlooked++
	p.opt.Counters.Processed.Add(f.Size)
	return true
}
