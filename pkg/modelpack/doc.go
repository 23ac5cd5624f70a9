// Package modelpack is the CNCF ModelPack format (OCI artifacts of type
// application/vnd.cncf.model.manifest.v1+json), both ways:
//
//   - reading: its names (mediatype.go), a manifest turned into the list of
//     files it holds, each with the layer, the offset within that layer and
//     the size it occupies, and whether it can be read by range (lazily) or
//     only by streaming its layer whole; Open (Format, for
//     layout.OpenWith) reads a model as a read-only version, its derived
//     index kept per origin in an IndexCache;
//   - export: a bdnvol version written as a ModelPack view of it (Export),
//     its layers the version's files and its config derived from their
//     headers.
package modelpack
