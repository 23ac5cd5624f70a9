// Package push seals a directory tree as a version of the volume format
// (pkg/layout) and stores it. Push runs the engine, a builder that holds
// the walk and each file's chunking result until the version is sealed;
// it reads and writes the format only through pkg/layout's API (the
// chunking rule, IndexBuilder, Seal and PieceSealer, CutPieces) and
// remembers trees through pkg/statcache. The algorithm, in pseudo-code:
//
//	walk the source, sorted by path (a local directory: statted in
//	parallel, nothing beneath it followed; special files refused)
//	forget the stat records of paths that are no longer regular files
//	if every file has a trusted stat record:
//	  seal first (below) from the records alone; if the destination has
//	  the root already, done: nothing is read or uploaded
//
//	chunk, large files in parallel, small files in path order meanwhile:
//	  large file (at least Params.Min bytes):
//	    the version before (Options.Previous) holds a file of the digest
//	    the source states, alone in whole chunks: take its chunk list
//	    else a trusted stat record lists its chunks: take them
//	    else read it once (a local file through read-only mappings, 16 MiB
//	    at a time: hashed in the page cache, not copied): cut where its
//	    header puts tensors (safetensors, GGUF), else content-defined
//	    (FastCDC); hash each chunk and the
//	    file as the bytes pass (one pass: the two SHA-256 computations
//	    interleaved, internal/sha2x); take each chunk's edge digests
//	  small files: packed in path order, a pack ending where a file's
//	    digest says (so a change moves only the pack around it); a pack
//	    whose members' digests the stat cache or the version before knows
//	    is not read
//	  each chunk goes to the uploader as it is cut
//
//	upload, Jobs at a time: each distinct chunk once, unless the
//	destination has it (or the version before, whose root is stored, holds
//	it); a chunk of one local file goes as a run of that file, opened
//	again and sent by the kernel (sendfile(2) over plain HTTP), not read
//	through the process; a pack's bytes as read for it (held, bounded); a
//	remote source's held in memory (bounded); the rest read again from
//	the source; the destination checks each against its digest
//	with a delta base (Options.DeltaBase): a chunk of a large file whose
//	file at the same path in the base version has a whole chunk of the
//	same size at the same offset holding the same tensors is XORed with
//	that chunk (fetched, verified; its own base when it is a delta), in
//	byte planes by dtype, zstd-compressed; the delta is uploaded instead
//	when at most MaxDeltaRatio of the chunk
//
//	seal:
//	  a piece memo of this tree's last push to this destination, whose
//	  version is still stored: cut the walk into pieces by the rule that
//	  cuts an index (layout.CutPieces); a piece whose fingerprint the memo
//	  holds is that piece, reused unbuilt; the others are built, checked
//	  and encoded (layout.PieceSealer)
//	  else, a million files to a destination: the same, piece by piece,
//	  the whole index never built
//	  else: the whole index, checked, sealed (layout.Seal)
//	  encoded pieces of many files are spilled to an unlinked file
//	with deltas: resealed as format version 3 (a delta table; delta blobs
//	  in the chunks' places; the bases listed after them)
//	store the index blobs, the part manifests and the root, in that order
//	save the stat cache (the records of the files read, from the results
//	held) and the piece memo of the version sealed
//
// The version is a function of the tree and the parameters only: a re-push
// that reuses records, chunk lists or pieces seals the same digest as a
// fresh push. It does not tag; the caller tags the returned root.
package push
