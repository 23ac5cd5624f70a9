package versions

import "github.com/bdnvol/bdnvol/pkg/oci"

// PublishReport is a published version as push and sync report it.
type PublishReport struct {
	Digest         string   `json:"digest"`
	Reference      string   `json:"reference"` // REPO@DIGEST
	Tags           []string `json:"tags"`
	Files          int      `json:"files"`
	Bytes          int64    `json:"bytes"`
	Chunks         int      `json:"chunks"`
	ChunksUploaded int64    `json:"chunks_uploaded"`
	BytesUploaded  int64    `json:"bytes_uploaded"`
	// PiecesReused are the index pieces a push took unchanged from the
	// version it pushed last from the same tree to the same repository;
	// PiecesBuilt the ones it built.
	PiecesReused int `json:"pieces_reused"`
	PiecesBuilt  int `json:"pieces_built"`
	// BytesAsChunks are the bytes of chunks uploaded plain, BytesAsDeltas
	// those of delta blobs uploaded; DeltaChunks the chunks stored as
	// deltas, DeltaChunkBytes their own bytes, and DeltaRatio
	// BytesAsDeltas / DeltaChunkBytes (0 without deltas).
	BytesAsChunks   int64   `json:"bytes_as_chunks"`
	BytesAsDeltas   int64   `json:"bytes_as_deltas"`
	DeltaChunks     int     `json:"delta_chunks"`
	DeltaChunkBytes int64   `json:"delta_chunk_bytes"`
	DeltaRatio      float64 `json:"delta_ratio"`
	// BaseBytesLocal are the base version's bytes a push with deltas read
	// from a local copy of it (push --base-dir), BaseBytesFetched those
	// it fetched from the repository to make the deltas.
	BaseBytesLocal   int64   `json:"base_bytes_local"`
	BaseBytesFetched int64   `json:"base_bytes_fetched"`
	Seconds          float64 `json:"seconds"`
}

// Report returns p, published in the repository ref names, as push and
// sync report it (Seconds is left to the caller).
func (p *Published) Report(ref oci.Ref) PublishReport {
	r := PublishReport{
		Digest:          p.Root.Digest.String(),
		Reference:       ref.Pinned(p.Root.Digest),
		Tags:            p.Tags,
		Files:           p.Files,
		Bytes:           p.Bytes,
		Chunks:          p.Chunks,
		ChunksUploaded:  p.ChunksUploaded,
		BytesUploaded:   p.BytesUploaded,
		PiecesReused:    p.PiecesReused,
		PiecesBuilt:     p.PiecesBuilt,
		BytesAsChunks:   p.ChunkBytesUploaded,
		BytesAsDeltas:   p.DeltaBytes,
		DeltaChunks:     p.DeltaChunks,
		DeltaChunkBytes: p.DeltaPlainBytes,

		BaseBytesLocal:   p.BaseBytesLocal,
		BaseBytesFetched: p.BaseBytesFetched,
	}
	if p.DeltaPlainBytes > 0 {
		r.DeltaRatio = float64(p.DeltaBytes) / float64(p.DeltaPlainBytes)
	}
	return r
}
