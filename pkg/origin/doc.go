// Package origin is the one chain that opens a version for reading: the
// reference resolved (a tag becomes a digest, the manifest's digest computed
// from its bytes) and checked under a signature policy, the registry's
// fetcher wrapped for metrics, the mirrors configured for its registry put
// in front of it, and the manifest put in the node's chunk cache so that
// reading the index costs no second round trip.
//
// pull, mount, the node plugin's mounter and warm all open versions through
// Resolve; what each does with the fetcher (a read-only or filling chunk
// cache, a lazy volume) stays theirs. Open then reads the version in any
// format this package imports (Formats: bdnvol's and ModelPack), so that a
// library caller of pull or lazy opens a ModelPack model as the CLI does.
//
//	ref ─oci.Open→ target ─signature policy (FetchManifest, Check)→ root
//	    target ─Wrap (metrics)→ ─mirrors→ Fetcher
//	    manifest bytes ─Preload→ chunk cache
package origin
