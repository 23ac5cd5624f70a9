// Package versions reads and moves the versions of a volume: it lists the
// sealed versions of a repository through their protective tags, resolves
// and inspects a reference, points human tags at an existing version while
// recording each move in the registry, and compares two versions at file and
// chunk level.
//
// # Version
//
// A sealed, immutable root manifest (or root index) of artifactType
// application/vnd.bdnvol.volume.v1. Every version has a protective tag
// sealed-<time>-<12 hex>, which gives its sealing time.
//
// # Human tag
//
// Any other tag that points at a version (prod, v3): a movable label.
//
// # History record
//
// The list of moves of one human tag, kept in the repository itself as a
// small manifest tagged history-<tag> whose annotations hold the whole list
// as JSON; each move pushes a new record with the full list under that tag,
// in one manifest PUT and without uploading any blob.
// The byte-level contract is docs/history.md.
package versions
