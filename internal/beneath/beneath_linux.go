package beneath

import "golang.org/x/sys/unix"

// DirFlags open a directory only to resolve names in it.
const DirFlags = unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC

func openat2(dfd int, rel string, flags int) (int, error) {
	return unix.Openat2(dfd, rel, &unix.OpenHow{
		Flags:   uint64(flags),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
}
