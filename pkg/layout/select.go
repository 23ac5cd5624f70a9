package layout

// Selection returns, by entry number, the entries of x that a partial pull
// or check covers: each regular file and symlink whose path keep accepts,
// and each directory that holds one of them (a directory is never selected
// by its own path, so an empty one is not either). A nil keep selects every
// entry.
func (x *Index) Selection(keep func(path string) bool) []bool {
	sel := make([]bool, x.Len())
	for i := range sel {
		if keep == nil {
			sel[i] = true
			continue
		}
		if x.Kind(i) == TypeDir || !keep(x.Path(i)) {
			continue
		}
		sel[i] = true
		for p := parentOf(x.Path(i)); p != ""; p = parentOf(p) {
			d, ok := x.Find(p)
			if !ok || sel[d] {
				break
			}
			sel[d] = true
		}
	}
	return sel
}
