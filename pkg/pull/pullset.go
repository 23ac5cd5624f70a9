package pull

import (
	"github.com/bdnvol/bdnvol/pkg/layout"
	"sync"
	"sync/atomic"
)

// pullSet holds the state of the regular files a pull writes, in flat
// arrays by entry number: 20 bytes a file, so that a pull of a million
// files holds 20 MB of it. Paths and sizes are the index's.
type pullSet struct {
	x         *layout.Index
	tmps      []*tmpDir      // the pull's temporary directories, by number
	remaining []atomic.Int64 // bytes not yet written from verified chunks
	ino       []uint64       // the temporary file's inode, once created
	state     []atomic.Uint32
	locks     [64]sync.Mutex // guard creating the temporary files, by entry number
	// wlocks serialise writes into one temporary file (by entry number):
	// concurrent writers of one file wait in Go instead of spinning on
	// its inode lock in the kernel, which on a copy_file_range of a whole
	// chunk burns a CPU for as long as the copy runs.
	wlocks [64]sync.Mutex
}

// Bits of pullSet.state; the number of the file's temporary directory is
// above them.
const (
	pfActive   = 1 << iota // the pull writes this file
	pfCreated              // its temporary file exists
	pfVerified             // its bytes were copied from a file checked against its digest
	pfTmpShift = 8
)

func newPullSet(x *layout.Index) *pullSet {
	n := x.Len()
	return &pullSet{
		x:         x,
		remaining: make([]atomic.Int64, n),
		ino:       make([]uint64, n),
		state:     make([]atomic.Uint32, n),
	}
}

// add makes entry i a file the pull writes, its temporary file in tmp.
func (s *pullSet) add(i int, tmp *tmpDir, verified bool) pullFile {
	num := -1
	for k, t := range s.tmps {
		if t == tmp {
			num = k
		}
	}
	if num < 0 {
		num = len(s.tmps)
		s.tmps = append(s.tmps, tmp)
	}
	st := uint32(pfActive | num<<pfTmpShift)
	if verified {
		st |= pfVerified
	}
	s.state[i].Store(st)
	return pullFile{s, i}
}

// active reports whether the pull writes entry i.
func (s *pullSet) active(i int) bool { return s.state[i].Load()&pfActive != 0 }

// at returns the file of entry i, which the pull writes.
func (s *pullSet) at(i int) pullFile { return pullFile{s, i} }

// pullFile is a regular file the pull writes: entry i of s.
type pullFile struct {
	s *pullSet
	i int
}

func (pf pullFile) path() string { return pf.s.x.Path(pf.i) }

func (pf pullFile) size() int64 { return sizeOf(pf.s.x, pf.i) }

func (pf pullFile) tmp() *tmpDir { return pf.s.tmps[pf.s.state[pf.i].Load()>>pfTmpShift] }

func (pf pullFile) remaining() *atomic.Int64 { return &pf.s.remaining[pf.i] }

// lock guards the creation of the temporary file.
func (pf pullFile) lock() *sync.Mutex { return &pf.s.locks[pf.i%len(pf.s.locks)] }

// writing guards writes into the temporary file.
func (pf pullFile) writing() *sync.Mutex { return &pf.s.wlocks[pf.i%len(pf.s.wlocks)] }

func (pf pullFile) created() bool { return pf.s.state[pf.i].Load()&pfCreated != 0 }

func (pf pullFile) setCreated() { pf.s.state[pf.i].Or(pfCreated) }

func (pf pullFile) verified() bool { return pf.s.state[pf.i].Load()&pfVerified != 0 }

func (pf pullFile) inode() uint64 { return pf.s.ino[pf.i] }

func (pf pullFile) setInode(ino uint64) { pf.s.ino[pf.i] = ino }
