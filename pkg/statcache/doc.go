// Package statcache is what a node remembers of the trees it pushed and
// pulled, kept per tree and chunking parameters in its cache directory:
//
//   - stat records: each file's stat key (size, mtime, ctime, inode),
//     digest and, for a large file a push cut, its chunks, so that a
//     re-push reads no unchanged file (Lookup; a push hands its records
//     over as it saves, SetFresh);
//   - pulled records: where a pull put a version's chunks in each file it
//     wrote, so that an upgrade copies them locally (StorePulled,
//     PulledFiles, SameExtents); the records of files written last are
//     settled or marked racy when saved;
//   - the index pieces of the version the last whole pull wrote
//     (TakePulledPieces), and the piece memo of the last push (LoadMemo,
//     SaveMemo): what lets a re-pull or re-push skip the unchanged pieces;
//   - the last push to each repository (LoadLastPush, SaveLastPush): the
//     directory and version, where the next push's delta bases may be
//     read.
//
// The records are one file, mapped and read by path, merged with new ones
// record by record when saved; a torn or corrupt file is refused and
// written anew. A nil *Cache is valid and remembers nothing.
package statcache
