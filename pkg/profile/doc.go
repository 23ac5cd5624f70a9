// Package profile records what a workload reads of a version when it
// starts, and gives it back as an order to fetch in.
//
// # Profile
//
// A small deterministic JSON document (media type MediaType): the digest of
// the version it belongs to and the digests of the chunks read during a
// start window, in first-read order. Nothing about the workload (no paths
// of its own, no times, no host) is in it, so the same reads give the same
// bytes on any node.
//
// # Recorder
//
// The read hook of a lazy volume: it notes each chunk the first time a read
// touches it, until reads pause (Quiet), the window's time bound (MaxTime)
// or its size bound (MaxChunks) is reached.
//
// # Order
//
// A profile replayed against an opened version: the version's chunk
// indices in the profile's order. A profile of another version is refused
// (ErrOtherVersion) and chunks the version does not have are skipped, so a
// stale or wrong profile costs bandwidth, never a wrong byte: the chunks
// are fetched through the verified chunk cache like any other read.
//
// # Sharing
//
// Profiles are kept next to the node's chunk cache (Store), and attached to
// their version as OCI referrers (Push, Fetch) with artifact type
// MediaType.
//
// # Use
//
// The one home of the feature: a mount (pkg/mounts), the node plugin
// (pkg/csi) and warming (pkg/warm) say what they want in Options (a mode:
// off, auto or a file; the node's store; the recording window) and call
// Find (a file, else the node's store, else a referrer), Start (in a
// mount's background: replay the profile found, or record one into the
// store in auto mode) or Replay.
package profile
