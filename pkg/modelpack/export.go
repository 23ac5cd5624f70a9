package modelpack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

// AnnotationVolumeDigest names, on a ModelPack view's manifest, the digest
// of the version it shows (the key image views use).
const AnnotationVolumeDigest = imageview.AnnotationVolumeDigest

// ErrNothingToExport is wrapped when a version has no regular file: a
// ModelPack config needs at least one layer.
var ErrNothingToExport = errors.New("no regular file to export")

// ExportedView is a ModelPack view built and pushed by Export.
type ExportedView struct {
	Image         string `json:"image"`    // REPO[:TAG]@DIGEST where it was pushed
	Digest        string `json:"digest"`   // of its manifest
	Attached      string `json:"attached"` // the referrer in the volume's repository
	Volume        string `json:"volume"`   // the version's pinned reference
	Layers        int    `json:"layers"`
	Bytes         int64  `json:"bytes"`          // of the layers
	SharedLayers  int    `json:"shared_layers"`  // layers that are chunks of the version
	SharedBytes   int64  `json:"shared_bytes"`   // their bytes: stored once for both
	BytesUploaded int64  `json:"bytes_uploaded"` // layers and config pushed
	// Skipped are the entries a ModelPack view cannot hold (symlinks).
	Skipped []string    `json:"skipped"`
	Config  ModelConfig `json:"config"`
	Seconds float64     `json:"seconds"`
}

// Export builds the ModelPack view of version root of the repository ref
// names (opened as t) and attaches it there as a referrer: the manifest's
// subject is the version. When dst names another repository (opened with
// dstOpt) the view is pushed there too; a tag of dst is pointed at it. A
// dst with a digest is refused (imageview.ErrDestinationDigest).
func Export(ctx context.Context, t oci.Target, ref oci.Ref, root ocispec.Descriptor, dst oci.Ref, dstOpt oci.Options) (*ExportedView, error) {
	if dst.Digest != "" {
		return nil, fmt.Errorf("%s: %w", dst, imageview.ErrDestinationDigest)
	}
	start := time.Now()
	ver, err := layout.OpenWith(ctx, t, root, layout.OpenOptions{Foreign: []layout.ForeignFormat{Format}})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	viewT, dsts, dst, err := imageview.Destinations(ctx, t, ref, dst, dstOpt)
	if err != nil {
		return nil, err
	}
	v, err := BuildView(ctx, t, ver, dsts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref.Pinned(root.Digest), err)
	}
	if dst.Tag != "" {
		if err := oci.TagBytes(ctx, viewT, v.Manifest, v.ManifestBytes, dst.Tag); err != nil {
			return nil, fmt.Errorf("%s: %w", dst, err)
		}
	}
	v.Out.Image = imageview.Named(dst, v.Manifest.Digest)
	v.Out.Digest = v.Manifest.Digest.String()
	v.Out.Attached = ref.Pinned(v.Manifest.Digest)
	v.Out.Volume = ref.Pinned(root.Digest)
	v.Out.Seconds = time.Since(start).Seconds()
	return &v.Out, nil
}

// View is a built and pushed ModelPack view.
type View struct {
	Manifest      ocispec.Descriptor
	ManifestBytes []byte
	Config        Config
	Out           ExportedView
}

// BuildView writes the ModelPack view of ver (whose chunks src serves) and
// pushes its layers, config and manifest to every destination, skipping
// blobs a destination has. Each regular file is one .raw layer, in index
// order, named by the file-path and title annotations; a file stored as one
// whole chunk of the version has that chunk's digest, so the view adds no
// bytes for it. The result depends on the version only.
func BuildView(ctx context.Context, src content.Fetcher, ver *layout.Version, dsts []imageview.Dest) (*View, error) {
	rd := imageview.NewFileReader(src, ver)
	x := newFacts()
	v := &View{Out: ExportedView{Skipped: []string{}}}
	var layers []ocispec.Descriptor
	for i := range ver.Index.Len() {
		f := ver.Index.File(i)
		switch f.Type {
		case layout.TypeDir:
			continue
		case layout.TypeSymlink:
			v.Out.Skipped = append(v.Out.Skipped, f.Path)
			continue
		}
		l, err := exportFile(ctx, rd, ver, f, x, dsts, &v.Out)
		if err != nil {
			return nil, fmt.Errorf("modelpack view of %s: %s: %w", ver.Root.Digest, f.Path, err)
		}
		layers = append(layers, l)
		v.Config.ModelFS.DiffIDs = append(v.Config.ModelFS.DiffIDs, l.Digest.String())
	}
	if len(layers) == 0 {
		return nil, fmt.Errorf("modelpack view of %s: %w", ver.Root.Digest, ErrNothingToExport)
	}
	v.Config.ModelFS.Type = "layers"
	v.Config.Config = x.config()
	v.Config.Descriptor = ConfigDescriptor{Family: x.family, Revision: ver.Root.Digest.String()}
	v.Out.Config = v.Config.Config
	cb, err := json.Marshal(v.Config)
	if err != nil {
		return nil, err
	}
	cd := content.NewDescriptorFromBytes(MediaTypeConfig, cb)
	up, err := imageview.PushAll(ctx, dsts, cd, func() (io.Reader, error) { return strings.NewReader(string(cb)), nil })
	if err != nil {
		return nil, fmt.Errorf("modelpack view of %s: config: %w", ver.Root.Digest, err)
	}
	if up {
		v.Out.BytesUploaded += cd.Size
	}
	subject := &ocispec.Descriptor{MediaType: ver.Root.MediaType, Digest: ver.Root.Digest, Size: ver.Root.Size}
	m := ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: ArtifactType,
		Config:       cd,
		Layers:       layers,
		Subject:      subject,
		Annotations:  map[string]string{AnnotationVolumeDigest: ver.Root.Digest.String()},
	}
	if v.ManifestBytes, err = json.Marshal(m); err != nil {
		return nil, err
	}
	v.Manifest = content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, v.ManifestBytes)
	v.Manifest.ArtifactType, v.Manifest.Annotations = ArtifactType, m.Annotations
	if err := imageview.PushReferrer(ctx, dsts, v.Manifest, v.ManifestBytes, *subject); err != nil {
		return nil, fmt.Errorf("modelpack view of %s: %w", ver.Root.Digest, err)
	}
	return v, nil
}

// headerBytes is how much of the start of a file export reads for the
// config: a config.json whole (up to 1 MiB), a weight file's header.
func headerBytes(p string, size int64) int64 {
	switch {
	case p == "config.json":
		return min(size, 1<<20)
	case tensorheader.IsSafetensors(p):
		return min(size, 8+tensorheader.SafetensorsHeaderLimit)
	case tensorheader.IsGGUF(p):
		return min(size, tensorheader.GGUFHeaderLimit)
	}
	return 0
}

// exportFile returns the .raw layer of file f, pushed to the destinations
// that lack it, and feeds the start of the file to x.
func exportFile(ctx context.Context, rd *imageview.FileReader, ver *layout.Version, f layout.File, x *facts, dsts []imageview.Dest, out *ExportedView) (ocispec.Descriptor, error) {
	meta, err := json.Marshal(fileMetadata(f))
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	l := ocispec.Descriptor{
		MediaType: MediaType(KindOf(f.Path), PackingRaw),
		Digest:    f.Digest,
		Size:      f.Size,
		Annotations: map[string]string{
			AnnotationFilepath:     f.Path,
			AnnotationTitle:        f.Path,
			AnnotationFileMetadata: string(meta),
		},
	}
	out.Layers++
	out.Bytes += f.Size
	if wholeChunk(ver, f) {
		out.SharedLayers++
		out.SharedBytes += f.Size
	}
	capture := &prefixWriter{max: headerBytes(f.Path, f.Size)}
	// A destination that lacks the blob gets it from a temporary copy of
	// the file, written once: streaming it from the chunks during the
	// upload would hold an upload open on a registry while reading from
	// it, which some registries serialise (a deadlock).
	var tmp *os.File
	defer func() {
		if tmp != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	up, err := imageview.PushAll(ctx, dsts, l, func() (io.Reader, error) {
		if tmp == nil {
			var err error
			if tmp, err = os.CreateTemp("", "bdnvol-modelpack-*"); err != nil {
				return nil, err
			}
			if err := rd.CopyFile(ctx, io.MultiWriter(capture, tmp), f); err != nil {
				return nil, err
			}
		}
		return io.NewSectionReader(tmp, 0, f.Size), nil
	})
	if err != nil {
		return l, err
	}
	if up {
		out.BytesUploaded += f.Size
	}
	if tmp == nil && capture.max > 0 {
		// Every destination had the blob: read the header only.
		capture.stop = true
		if err := rd.CopyFile(ctx, capture, f); err != nil && !errors.Is(err, errPrefixFull) {
			return l, err
		}
	}
	x.add(f.Path, f.Size, capture.b)
	return l, nil
}

// wholeChunk reports whether f is stored as one whole chunk of ver (whose
// digest is then the file's).
func wholeChunk(ver *layout.Version, f layout.File) bool {
	if len(f.Extents) != 1 {
		return false
	}
	e := f.Extents[0]
	c := ver.Chunk(e.Chunk)
	return e.Offset == 0 && e.Length == c.Size && c.Digest == f.Digest && !ver.IsDelta(e.Chunk) // a delta chunk is no blob of its own
}

// exportMetadata is the value of a layer's AnnotationFileMetadata as
// export writes it.
type exportMetadata struct {
	Name     string    `json:"name"`
	Mode     uint32    `json:"mode"`
	UID      uint32    `json:"uid"`
	GID      uint32    `json:"gid"`
	Size     int64     `json:"size"`
	ModTime  time.Time `json:"mtime"`
	Typeflag byte      `json:"typeflag"`
}

// fileMetadata is f's metadata as export writes it, as modctl does: the
// base name, typeflag 0; fixed owner and time.
func fileMetadata(f layout.File) exportMetadata {
	return exportMetadata{Name: path.Base(f.Path), Mode: uint32(f.Mode & 0o777), Size: f.Size, ModTime: time.Unix(0, 0).UTC(), Typeflag: 0}
}

// errPrefixFull stops a read once a prefixWriter has what it wants.
var errPrefixFull = errors.New("prefix read")

// prefixWriter keeps the first max bytes written to it. It never fails
// unless stop is set, when it ends the copy with errPrefixFull once full.
type prefixWriter struct {
	b    []byte
	max  int64
	stop bool
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	if n := w.max - int64(len(w.b)); n > 0 {
		w.b = append(w.b, p[:min(int64(len(p)), n)]...)
	}
	if w.stop && int64(len(w.b)) >= w.max {
		return 0, errPrefixFull
	}
	return len(p), nil
}
