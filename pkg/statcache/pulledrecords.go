package statcache

import "sort"

// PulledRecords are the records of what earlier pulls wrote in a
// directory: a few held in memory, the rest read from the mapped record
// file when asked for. A nil *PulledRecords holds none.
type PulledRecords struct {
	disk  *recFile
	keeps []func(p string) bool
	mem   map[string]Record // before those on disk
	keys  []string          // of mem, sorted
}

// Get returns the record of path p.
func (r *PulledRecords) Get(p string) (Record, bool) {
	if r == nil {
		return Record{}, false
	}
	if f, ok := r.mem[p]; ok {
		return f, true
	}
	if !r.fromDisk(p) {
		return Record{}, false
	}
	f, ok := r.disk.find(p)
	return f, ok && isPulled(p, f)
}

// fromDisk reports whether a record of p on disk counts: none in memory
// stands for it and no prune dropped it.
func (r *PulledRecords) fromDisk(p string) bool {
	if _, ok := r.mem[p]; ok || r.disk == nil {
		return false
	}
	for _, keep := range r.keeps {
		if !keep(p) {
			return false
		}
	}
	return true
}

// Empty reports whether there are no records.
func (r *PulledRecords) Empty() bool {
	if r == nil {
		return true
	}
	empty := len(r.mem) == 0
	r.disk.each(func(p string, f Record) bool {
		if r.fromDisk(p) && isPulled(p, f) {
			empty = false
		}
		return empty
	})
	return empty
}

// Each calls fn with each record, in path order, until fn returns false.
func (r *PulledRecords) Each(fn func(p string, f Record) bool) {
	if r == nil {
		return
	}
	keys := r.keys
	more := true
	r.disk.each(func(p string, f Record) bool {
		for more && len(keys) > 0 && keys[0] < p {
			more = fn(keys[0], r.mem[keys[0]])
			keys = keys[1:]
		}
		if more && r.fromDisk(p) && isPulled(p, f) {
			more = fn(p, f)
		}
		return more
	})
	for more && len(keys) > 0 {
		more = fn(keys[0], r.mem[keys[0]])
		keys = keys[1:]
	}
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
