// Package retention decides which versions of a volume may go and carries
// the decision out without ever deleting a version that a deployment still
// needs. docs/retention.md is the contract.
//
// # Plan
//
// NewPlan is pure: the versions of a repository (digest, sealing time,
// human tags), the tombstones of soft-deleted versions and the references
// found in deploy files, standard input and running mounts go in; a plan
// comes out that says for every version KEEP or DELETE and why, and for every
// tombstone whether it is purged. Apply carries a plan out, re-checking each
// version's tags and references right before it touches it.
//
// # Reference
//
// A string that names a version of the repository: REPO@sha256:<hex>,
// REPO:TAG@sha256:<hex> (the digest counts) or REPO:TAG (the version the tag
// points at counts), found anywhere in a YAML or JSON text; or a bdnvol
// mount running on this machine.
//
// # Tombstone
//
// A soft delete pushes a small image index (artifactType
// application/vnd.bdnvol.tombstone.v1) whose only manifest is the deleted
// version's root, tagged deleted-<time>-<12 hex>, and points the version's
// protective and human tags at it. The version leaves the version list but
// stays reachable, so any registry's garbage collector keeps it, until a
// purge deletes it by digest. Restore gives it a new protective tag.
package retention
