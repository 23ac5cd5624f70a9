// Package pull materialises a version in a directory. Pull resolves a
// reference under a signature policy and fetches through mirrors and the
// node's chunk cache; Materialise, the engine, writes the tree. The engine
// reads the volume format only through pkg/layout's API (the index, its
// extents) and remembers trees through pkg/statcache (its pull records).
//
// A pull writes every regular file under a temporary name in a private
// directory of the destination (.bdnvol-pull, locked against a second
// pull), from chunks whose digests are checked, and renames it into place
// once all its bytes are there. Every path is resolved beneath the
// destination without following a symlink. The algorithm, in pseudo-code:
//
//	plan:
//	  make the directories, writable while they fill
//	  for each regular file f:
//	    if the file at f's name holds f's bytes (the stat cache vouches for
//	    its stat key, or an earlier pull wrote it from the same chunks, or,
//	    with no record, its SHA-256 is f's) and has no other link:
//	      keep it; next
//	    open f's temporary file; one an interrupted pull left (resume) is
//	    kept: its extents that hold a whole chunk with the right digest are
//	    done (holes are never read)
//	    list the extents still to write under their chunks
//
//	local reuse: for each chunk still needed, where it may already be:
//	  where an earlier pull's record puts it (an upgrade), vouched for when
//	  the record is not racy; else at the same place in the file at the
//	  final name (an in-place fine-tune); else where cutting an unrecorded
//	  file as a push would finds it
//	  a delta chunk (format 3): where its base may be, found the same ways
//
//	transfer, Jobs at a time (Jobs lowered so that the pull's descriptors,
//	  fdBound, fit under RLIMIT_NOFILE: fdlimit.go):
//	  copy each local chunk to its targets:
//	    vouched: in the kernel, unhashed (copy_file_range, a reflink where
//	      the file system can), the source's stat key the same before and
//	      after; any doubt: the hashed way
//	    else: read and hash it like a fetched chunk
//	    not the chunk's bytes after all: fetch it, at once
//	  fetch each other chunk, retried a bounded number of times:
//	    packed (several files, small): whole into memory (bounded), checked,
//	      each file wholly inside it written and renamed at once
//	    else: streamed to its targets, its digest checked at the end (its
//	      halves hashed beside another streamed chunk's, the two SHA-256
//	      computations interleaved, when one is offered meanwhile:
//	      internal/sha2x)
//	    a delta chunk whose base is fetched: its delta blob fetched and
//	      decoded first (its base's body opened meanwhile), then streamed
//	      like a plain chunk: each half read from the base's body has the
//	      delta's planes for its elements XORed in
//	      (layout.WithStreamedDeltas) before it is hashed (paired) and
//	      written, the digest checked at the end; a short or long base body
//	      is an error. The retry of a chunk that fails decodes it whole
//	      (below), which names the base or the delta
//	    a delta chunk whose base is in the directory (or its retry, or
//	      one packed): its delta blob and its base (read in the directory
//	      if it is there, else fetched; both at once) decoded and checked
//	      against the chunk's digest before a byte is written, the one
//	      hash of its bytes (the writer trusts the decoder's
//	      verify.Checked; the base is hashed only when the chunk fails, and
//	      a local base that lies is then fetched); one whose base is in the
//	      directory is fetched with the local copies, before any file is
//	      renamed over that base
//	  when a file's last byte is written: finish it
//
//	finish f (optionally hash it whole first):
//	  set its mode; wait while local copies may read the file at f's name
//	  rename the temporary into place: renameat2(RENAME_NOREPLACE); if
//	  something is there, RENAME_EXCHANGE and unlink the old file from the
//	  private directory (a plain rename over a file makes ext4 flush it
//	  first); an empty directory there goes, one with contents is an error
//	  record f's stat key and extents in the stat cache
//
//	finalise:
//	  remove the files an earlier pull wrote that this version lacks, if
//	  unchanged since; make the symlinks; set the directories' modes,
//	  children first
//	  save the stat cache: a file changed less than the racy margin
//	  (100 ms) before the save cannot be proven unchanged by its stat key
//	  later, so its record is racy (its digest not trusted, its extents a
//	  hint whose copies are hashed); when many bytes were written last, the
//	  pull waits out the margin and stats them again instead
//
// A failed or cancelled pull leaves its temporary files; the next pull into
// the directory fetches only what they lack. Unverified bytes never appear
// under a final name.
package pull
