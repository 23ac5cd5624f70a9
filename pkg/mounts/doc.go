// Package mounts is the lifecycle of bdnvol FUSE mounts shared by the CLI
// (`bdnvol mount`, `umount`, `mounts`, `profile`), the Kubernetes node
// plugin's mounter (pkg/csi) and warming (pkg/warm): what to mount (a
// reference, or a deploy file's mounts), opening it through pkg/origin,
// serving a lazy.Volume at a directory until it is gone, daemonising
// through a ready pipe, the state files a mount records about itself,
// reading the mount table (/proc/self/mountinfo), unmounting one entry,
// and the startup profiles a mount finds, replays and records.
//
// What it may import is its row of docs/packages.md.
package mounts
