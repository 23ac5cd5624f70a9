// Package mounts is the lifecycle of bdnvol FUSE mounts shared by the CLI
// (`bdnvol mount`, `umount`, `mounts`) and the Kubernetes node plugin:
// serving a lazy.Volume at a directory, daemonising through a ready pipe,
// the state files a mount records about itself, reading the mount table
// (/proc/self/mountinfo) and unmounting one entry.
//
// It may import pkg/lazy, pkg/oci and pkg/layout; nothing in pkg/ imports it.
package mounts
