// Package layout is the bdnvol volume format: what a version is, how it is
// encoded and how it is read. It holds the chunking rule (content-defined
// cuts, tensor-aligned cuts), the file index and the rule that cuts it into
// pieces, sealing an index as OCI manifests, and opening a sealed version.
// Writing one from a tree is pkg/push's; what a node remembers of trees
// it pushed and pulled is pkg/statcache's.
//
// # Volume
//
// A named series of sealed versions stored in one OCI repository.
//
// # Version
//
// An immutable snapshot of a directory. Its digest is the digest of the root
// manifest (or, for very large volumes, the root image index of part
// manifests). Identical contents give an identical digest.
//
// # Index
//
// The file index: every path with its type, permission bits, size, SHA-256
// and extents. In format version 1 it is one blob, the first layer of the
// root (or first part) manifest; in format version 2 that layer is a small
// top-level index listing pieces, the next layers, each a run of entries
// with its own chunk table, so that an unchanged piece is not uploaded
// again. An opened index holds its entries in a compact form.
//
// # Chunk
//
// A blob holding a run of bytes: a content-defined piece of a large file, a
// tensor-aligned piece of a safetensors file, or a pack of small files.
//
// # Extent
//
// A (chunk, offset, length) triple; a file's bytes are its extents in order.
//
// The byte-level contract is docs/format.md.
package layout
