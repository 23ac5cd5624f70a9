// Package lazy reads a sealed version without pulling it: each file is an
// io.ReaderAt whose reads fetch, verify and cache only the chunks they touch,
// and a read-only FUSE file system serves those files.
//
// # Fetcher
//
// Where chunk bytes come from: a registry repository, an OCI layout, an
// in-memory store in tests. Its method set is oras-go's content.Fetcher, so
// any oras target is a Fetcher.
//
// # Cache
//
// A directory of verified chunks named by digest, shared by every mount and
// process on the machine. Entries are written to a temporary name and renamed
// into place only after their digest matched, so a crash never leaves a
// partly written entry under a final name; the first read of an entry by a
// process checks its digest again. The cache is bounded by size and evicts
// the least recently used entries. Concurrent loads of one chunk fetch it
// once.
//
// # Volume
//
// A version opened for reading: its index, a Cache, and a Fetcher. Volume.File
// returns a File, an io.ReaderAt over a regular file's extents. Sequential
// reads fetch the next chunks ahead in parallel; safetensors and GGUF headers can be
// fetched early with PrefetchHeaders; Prefetch fills the cache in the order
// files are likely read.
//
// # Mount
//
// Mount serves a Volume as a read-only FUSE file system (go-fuse): modes and
// symlinks from the index, every write refused with EROFS, any fetch or
// verification failure turned into EIO, and the version's digest exposed as
// the extended attribute user.bdnvol.digest of the root.
package lazy
