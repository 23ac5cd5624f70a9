// Package csi is the Kubernetes CSI node plugin of bdnvol: the Identity and
// Node services that kubelet calls (Node), and the mounter (Mounter) that
// holds one FUSE mount per digest per node over one shared chunk cache.
//
// Three processes, so that the file systems outlive the plugin and the
// mounter: the mounter serves every FUSE mount and rarely changes; the node
// plugin is a thin translator that resolves the reference with the pod's
// credentials, asks the mounter for the digest's mount over a unix socket,
// and bind-mounts it read-only at the pod's target path; the fd holder
// (ServeFDHolder, `bdnvol csi fd-holder`) keeps a copy of each mount's FUSE
// descriptor, so that a new mounter takes over the mounts of one that
// crashed (a mounter that is replaced hands them over itself). Killing the
// node plugin leaves every reader untouched; on start it re-attaches from
// its state directory and the mount table.
//
// What it may import is its row of docs/packages.md.
package csi

// DriverName is the CSI driver name of bdnvol.
const DriverName = "csi.bdnvol.dev"
