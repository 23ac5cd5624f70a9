// Package kuberefs reads the objects of a live Kubernetes cluster that can
// name a bdnvol version (pods, workload templates, persistent volumes and
// config maps such as the warm list), so that retention keeps what a
// running pod mounts or a workload would mount on its next rollout.
//
// It speaks the API server's list protocol directly (paged lists, a
// kubeconfig or the pod's service account), with no client library: the
// objects are handed over as JSON for retention's reference scan. It fails
// closed: a list it cannot read fails the whole read, so that a deletion is
// never planned from part of the cluster.
package kuberefs
