// Package kuberefs reads the objects of a live Kubernetes cluster that can
// name a bdnvol version (pods, workload templates, persistent volumes and
// config maps such as the warm list), so that retention keeps what a
// running pod mounts or a workload would mount on its next rollout.
//
// It reaches the cluster through pkg/kubeclient (client-go's kubeconfig
// resolution, or the pod's service account) and reads each kind with
// client-go.s dynamic client and pager, page by page: the objects are handed over as
// JSON for retention's reference scan. It fails closed: a list it cannot
// read, or a page that is not a list of the kind asked for, fails the whole
// read, so that a deletion is never planned from part of the cluster.
package kuberefs
