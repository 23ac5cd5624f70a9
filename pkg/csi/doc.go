// Package csi is the Kubernetes CSI node plugin of bdnvol: the Identity and
// Node services that kubelet calls (Node), and the mounter (Mounter) that
// holds one FUSE mount per digest per node over one shared chunk cache.
//
// Two processes, so that the file systems outlive the plugin: the mounter
// serves every FUSE mount and rarely changes; the node plugin is a thin
// translator that resolves the reference with the pod's credentials, asks
// the mounter for the digest's mount over a unix socket, and bind-mounts it
// read-only at the pod's target path. Killing the node plugin leaves every
// reader untouched; on start it re-attaches from its state directory and
// the mount table.
//
// It may import pkg/mounts, pkg/lazy, pkg/layout and pkg/oci.
package csi

// DriverName is the CSI driver name of bdnvol.
const DriverName = "csi.bdnvol.dev"
