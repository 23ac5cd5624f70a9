// Package modelpack reads the CNCF ModelPack format (OCI artifacts of type
// application/vnd.cncf.model.manifest.v1+json): its names (mediatype.go) and
// a manifest turned into the list of files it holds, each with the layer,
// the offset within that layer and the size it occupies, and whether it can
// be read by range (lazily) or only by streaming its layer whole.
package modelpack
