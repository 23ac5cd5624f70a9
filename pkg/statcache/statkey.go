package statcache

import (
	"io/fs"
	"syscall"
)

// Key identifies a file's state on disk for the stat cache.
type Key struct {
	Size  int64  `json:"s"`
	Mtime int64  `json:"m"`
	Ctime int64  `json:"c"`
	Ino   uint64 `json:"i"`
}

// KeyOf returns the stat key of the file info describes.
func KeyOf(info fs.FileInfo) Key {
	k := Key{Size: info.Size(), Mtime: info.ModTime().UnixNano()}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		k.Ino = st.Ino
		k.Ctime = ctime(st)
	}
	return k
}
