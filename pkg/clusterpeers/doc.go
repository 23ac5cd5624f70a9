// Package clusterpeers wires the peer tier (pkg/peer) to a Kubernetes
// cluster through its API server, with client-go: the mounters' peer
// addresses from the EndpointSlices of their headless Service (Watch), and
// the cluster CA of peer mutual TLS from one Secret (LoadOrCreateCA), which
// the first mounter to start fills and the others read. Membership and
// discovery are Kubernetes' own; bdnvol adds no protocol of its own.
package clusterpeers
