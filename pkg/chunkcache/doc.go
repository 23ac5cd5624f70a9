// Package chunkcache is the node's verified chunk cache: an on-disk,
// content-addressed store of blobs checked against their digests before
// they are stored or served, shared by every process on the node that opens
// the same directory (mounts, pull, the Kubernetes node plugin, warming).
//
// Loads of one digest are joined; the size bound is kept with
// least-recently-used eviction, except for entries that an owner (a mount)
// protects. An entry written by this process carries a verification mark
// (an extended attribute bound to its inode and size), so another process
// can trust it without hashing it again; unmarked entries are hashed before
// use and dropped when wrong. ReadOnly gives pull a view that serves what
// is cached and fetches the rest without storing it.
package chunkcache
