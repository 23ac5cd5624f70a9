// Package imageview builds an OCI image of a sealed version: its tree under
// a fixed directory, in eStargz layers that a stargz snapshotter pulls
// lazily, attached to the version as an OCI referrer.
//
// Build is deterministic: the image digest is a function of the version and
// the options only (fixed timestamps and owners, index order, fixed gzip
// level and parallelism, no host names or clocks).
//
// Layers are cut so that a fine-tune changes only the layers of the files it
// changed: layer 1 holds every directory, symlink and small file (loaders'
// first reads: config.json, tokenizer files, other JSON, prioritised in the
// eStargz TOC so a snapshotter prefetches them); the other files follow in
// path order, whole, packed into layers of at most LayerBytes of content,
// and a file larger than that has a layer of its own.
package imageview
