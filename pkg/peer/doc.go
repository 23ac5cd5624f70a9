// Package peer is the peer tier of a cluster's chunk caches: each node's
// mounter serves the verified chunks of its cache to the other nodes as
// OCI blob requests, and asks them before the registry, so that a rollout
// of one version on N nodes asks the registry for each chunk about once.
//
// The algorithm:
//
//  1. Membership is given from outside (Ring.Set): the addresses of the
//     cluster's mounters, as an engine that exists reports them
//     (Kubernetes EndpointSlices, a static list); never a protocol of ours.
//  2. Each chunk has an owner: the peer with the highest rendezvous hash of
//     (digest, address) among those not marked down, so every node agrees
//     on it without talking, and a departure moves only that peer's share.
//  3. A node reading a chunk through a Fetcher asks the owner (then the
//     next owner) before its own source (the registry, behind its
//     mirrors). The owner serves the chunk from its cache, or, when it
//     does not hold it yet but serves a mount of the same origin whose
//     version lists the chunk, fetches it from the registry once (the
//     cache joins concurrent loads) and serves it as soon as it is
//     verified: one registry fetch per chunk per cluster, as chunks
//     arrive, not after the whole version. The mount's source is withdrawn
//     when the mount ends (Fetcher.Close, called as its volume closes).
//     An owner with no such mount yet (its pod starts later) refuses, and
//     the asker fetches the chunk from its own source; the owner records
//     the asker (Ring.Hint, from the request's Bdnvol-Peer-From header, a
//     member only, bounded) and asks it first when it needs the chunk
//     itself or fetches it for another peer, so pods that start seconds
//     apart still cost the registry one fetch per chunk. The nodes of a
//     `bdnvol pull` fleet start within a few seconds of one another: for
//     its first 3 s a node tries again a peer that refuses connections and
//     has never answered (it is starting), and holds the requests for an
//     origin it has not opened yet, rather than sending them on to the
//     registry.
//  4. A peer's chunk streams into the asker's cache as it arrives and is
//     verified against its digest as it passes; a peer that fails, is slow
//     or serves wrong bytes ends the stream with a
//     chunkcache.RefetchError, so the load starts again from the next
//     owner or the source: a fallback, never a wrong byte; and the peer is
//     skipped for a cooldown. A peer is asked for whole chunks only, with
//     a deadline that a link as fast as the registry's meets (Grace for
//     the first byte, then MinRate).
//  5. Access follows the chunk cache's origin rule (chunkcache.Cache.For):
//     a peer serves a chunk for an origin (registry and repository) only
//     if that origin delivered it, to it or to a node it got it from, and
//     fetches one from the origin for a peer only if a manifest it read
//     lists it (a digest a peer names is never fetched on its word); a
//     node asks peers only inside a mount it opened with a pod's own
//     credentials. Peers talk over mutual TLS with certificates of one
//     cluster CA (a Secret the chart makes), so only mounters reach one
//     another.
//  6. Work is bounded: requests served at once (more are refused with
//     503, which sends the asker to its next choice), requests asked at
//     once (more go to the source), and the bytes each holds in memory (a
//     copy buffer: chunks stream to and from the caches' files).
package peer
