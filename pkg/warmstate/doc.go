// Package warmstate owns warm-state companions: an engine's compile and
// kernel caches (torch.compile, Triton, CUDA graphs, TensorRT engines)
// sealed as a tree in the volume format and attached to the version they
// were built for as an OCI referrer. A companion is an image index of
// artifact type ArtifactType whose subject is the version's root, whose one
// manifest is the sealed tree's root, and whose annotations carry its Key;
// signing the index's digest covers the key. A reader asks for a key and
// gets the companion whose key equals it, every field, or nothing
// (Find). Publish seals and attaches one under a lease, once per key; a
// companion is never updated in place. See docs/warm-state.md.
package warmstate
