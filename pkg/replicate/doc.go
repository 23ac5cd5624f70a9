// Package replicate copies versions between repositories (registries and
// OCI layouts, in any direction) with their digests preserved: it walks a
// root's graph (index, manifests, config and layers), sends only the blobs
// the destination lacks, streams each from the source to the destination
// verified against its digest on the way, mounts blobs across repositories
// of one registry, and pushes manifests children first and tags last, so an
// interrupted copy leaves nothing tagged that is incomplete and a re-run
// sends only what is missing. What a source can size is bounded (blob
// sizes, manifests, referrer depth), and a copy never replaces the
// destination's tag history, signatures or protective and tombstone tags
// (see settleTags).
package replicate
