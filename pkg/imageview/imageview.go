package imageview

import (
	"archive/tar"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// AnnotationVolumeDigest names, on an image view's manifest and in its
// config's labels, the digest of the version it shows.
const AnnotationVolumeDigest = "io.bdnvol.volume.digest"

// Layer annotations the stargz snapshotter reads.
const (
	AnnotationTOCDigest        = "containerd.io/snapshot/stargz/toc.digest"
	AnnotationUncompressedSize = "io.containers.estargz.uncompressed-size"
)

// Defaults of Options.
const (
	DefaultRoot       = "models"
	DefaultLayerBytes = 512 << 20
	// SmallFileBytes: files below this size go in the first layer.
	SmallFileBytes = 1 << 20
	// MaxLayers bounds the layers of an image view: overlay-based
	// snapshotters stack at most about 128 layers. A plan with more has its
	// layer bound doubled until it fits.
	MaxLayers = 120
)

// build parameters fixed for reproducibility: changing one changes every
// image digest.
const (
	gzipLevel   = gzip.BestSpeed
	tocChunk    = 4 << 20
	parallelism = 4
)

// ErrInvalidOptions is wrapped when Options cannot describe an image.
var ErrInvalidOptions = errors.New("invalid image view options")

// ErrWhiteoutName is wrapped when a path of the version has a component
// starting with ".wh.", which container runtimes read as an OCI whiteout.
var ErrWhiteoutName = errors.New(`name starts with ".wh." (an OCI whiteout in an image layer)`)

// ErrCorrupt is wrapped when a file read from the version does not match
// its digest in the file index.
var ErrCorrupt = errors.New("file does not match its digest")

// Options configure Build. Zero values select defaults.
type Options struct {
	// Root is the directory of the image that holds the tree ("models").
	Root string
	// LayerBytes bounds the file content of one layer (512 MiB); a larger
	// file gets a layer of its own.
	LayerBytes int64
	// OS and Architecture of the image config ("linux", "amd64").
	OS, Architecture string
	// TempDir holds one layer at a time while it is built ("": os.TempDir).
	TempDir string
	// Foreign are the formats besides bdnvol's that Export reads the
	// version in (origin.Formats); none: a bdnvol volume only.
	Foreign []layout.ForeignFormat
}

func (o Options) withDefaults() (Options, error) {
	if o.Root == "" {
		o.Root = DefaultRoot
	}
	o.Root = strings.Trim(o.Root, "/")
	if o.Root == "" || !isCleanPath(o.Root) {
		return o, fmt.Errorf("root %q: %w: want a relative, clean directory path", o.Root, ErrInvalidOptions)
	}
	if strings.HasPrefix(o.Root, whiteoutPrefix) || strings.Contains(o.Root, "/"+whiteoutPrefix) {
		return o, fmt.Errorf("root %q: %w: %w", o.Root, ErrInvalidOptions, ErrWhiteoutName)
	}
	if o.LayerBytes == 0 {
		o.LayerBytes = DefaultLayerBytes
	}
	if o.LayerBytes < 0 {
		return o, fmt.Errorf("layer size %d: %w", o.LayerBytes, ErrInvalidOptions)
	}
	if o.OS == "" {
		o.OS = "linux"
	}
	if o.Architecture == "" {
		o.Architecture = "amd64"
	}
	return o, nil
}

func isCleanPath(p string) bool {
	return path.Clean(p) == p && !strings.HasPrefix(p, "../") && p != ".." && p != "."
}

// Dest receives the blobs and manifest of an image view.
type Dest interface {
	content.Pusher
	Exists(ctx context.Context, desc ocispec.Descriptor) (bool, error)
}

// Layer is one layer of an image view.
type Layer struct {
	Desc     ocispec.Descriptor
	Files    int   // regular files in it
	Bytes    int64 // their content
	Uploaded bool  // pushed to at least one destination that lacked it
}

// Image is a built and pushed image view.
type Image struct {
	Manifest      ocispec.Descriptor
	ManifestBytes []byte
	Config        ocispec.Descriptor
	Layers        []Layer
	// BytesUploaded counts the layer and config bytes pushed (to every
	// destination; blobs already there are not pushed).
	BytesUploaded int64
}

// Plan is how the files of a version are cut into layers: the index
// positions of the entries of each layer. Layer 0 holds every directory,
// symlink and small file; the other files follow in index order, packed
// into layers of at most layerBytes (doubled until there are at most
// MaxLayers layers).
func Plan(x *layout.Index, layerBytes int64) [][]int {
	if layerBytes <= 0 {
		layerBytes = DefaultLayerBytes
	}
	for {
		p := plan(x, layerBytes)
		if len(p) <= MaxLayers || layerBytes > 1<<50 {
			return p
		}
		layerBytes *= 2
	}
}

func plan(x *layout.Index, layerBytes int64) [][]int {
	first := []int{}
	var big []int
	for i := range x.Len() {
		f := x.File(i)
		if f.Type != layout.TypeFile || f.Size < SmallFileBytes || priority(f.Path) >= 0 {
			first = append(first, i)
		} else {
			big = append(big, i)
		}
	}
	out := [][]int{first}
	var cur []int
	var n int64
	for _, i := range big {
		s := x.File(i).Size
		if len(cur) > 0 && n+s > layerBytes {
			out = append(out, cur)
			cur, n = nil, 0
		}
		cur = append(cur, i)
		n += s
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// checkNames refuses an index with a path a runtime would read as a
// whiteout: such an entry would hide or remove files of the mounted image,
// which would then differ from the version.
func checkNames(x *layout.Index) error {
	for i := range x.Len() {
		p := x.File(i).Path
		for c := range strings.SplitSeq(p, "/") {
			if strings.HasPrefix(c, whiteoutPrefix) {
				return fmt.Errorf("%q: %w", p, ErrWhiteoutName)
			}
		}
	}
	return nil
}

// whiteoutPrefix marks a whiteout entry in an OCI image layer.
const whiteoutPrefix = ".wh."

// priority ranks the files a model loader reads first: 0 for config.json,
// 1 for other JSON and tokenizer files; -1 for the rest.
func priority(p string) int {
	base := path.Base(p)
	switch {
	case base == "config.json":
		return 0
	case strings.HasSuffix(base, ".json"), strings.HasPrefix(base, "tokenizer"):
		return 1
	}
	return -1
}

// Build writes the image view of ver (whose chunks src serves, each
// verified against its digest, and each file against its own) and pushes
// its layers, config and manifest to every destination, skipping blobs a
// destination already has. The manifest's subject is ver's root. It does
// not tag anything.
func Build(ctx context.Context, src content.Fetcher, ver *layout.Version, dsts []Dest, opt Options) (*Image, error) {
	opt, err := opt.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkNames(ver.Index); err != nil {
		return nil, fmt.Errorf("image view of %s: %w", ver.Root.Digest, err)
	}
	rd := NewFileReader(src, ver)
	img := &Image{}
	var diffIDs []digest.Digest
	for n, entries := range Plan(ver.Index, opt.LayerBytes) {
		l, diffID, err := buildLayer(ctx, rd, ver, entries, n == 0, dsts, opt)
		if err != nil {
			return nil, fmt.Errorf("image view of %s: layer %d: %w", ver.Root.Digest, n+1, err)
		}
		if l.Uploaded {
			img.BytesUploaded += l.Desc.Size
		}
		img.Layers = append(img.Layers, l)
		diffIDs = append(diffIDs, diffID)
	}
	vd := ver.Root.Digest.String()
	cfg := ocispec.Image{
		Platform: ocispec.Platform{OS: opt.OS, Architecture: opt.Architecture},
		Config:   ocispec.ImageConfig{Labels: map[string]string{AnnotationVolumeDigest: vd}, WorkingDir: "/" + opt.Root},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: diffIDs},
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	img.Config = content.NewDescriptorFromBytes(ocispec.MediaTypeImageConfig, cb)
	up, err := PushAll(ctx, dsts, img.Config, func() (io.Reader, error) { return strings.NewReader(string(cb)), nil })
	if err != nil {
		return nil, fmt.Errorf("image view of %s: config: %w", ver.Root.Digest, err)
	}
	if up {
		img.BytesUploaded += img.Config.Size
	}
	layers := make([]ocispec.Descriptor, len(img.Layers))
	for i, l := range img.Layers {
		layers[i] = l.Desc
	}
	m := ocispec.Manifest{
		Versioned:   specs.Versioned{SchemaVersion: 2},
		MediaType:   ocispec.MediaTypeImageManifest,
		Config:      img.Config,
		Layers:      layers,
		Subject:     &ocispec.Descriptor{MediaType: ver.Root.MediaType, Digest: ver.Root.Digest, Size: ver.Root.Size},
		Annotations: map[string]string{AnnotationVolumeDigest: vd},
	}
	mb, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	img.ManifestBytes = mb
	img.Manifest = content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, mb)
	img.Manifest.Annotations = m.Annotations
	if err := PushReferrer(ctx, dsts, img.Manifest, mb, *m.Subject); err != nil {
		return nil, fmt.Errorf("image view of %s: %w", ver.Root.Digest, err)
	}
	return img, nil
}

// PushReferrer pushes the manifest desc (its bytes b), whose subject is
// subject, to every destination.
func PushReferrer(ctx context.Context, dsts []Dest, desc ocispec.Descriptor, b []byte, subject ocispec.Descriptor) error {
	for _, d := range dsts {
		// Where the registry serves the referrers API it lists the view by
		// its subject; asking first keeps the push from also writing the
		// tag-schema fallback index, which registries that do not send
		// OCI-Subject would otherwise get.
		if _, err := oci.ServesReferrers(ctx, d, subject); err != nil {
			return err
		}
		if err := d.Push(ctx, desc, strings.NewReader(string(b))); err != nil && !alreadyExists(err) {
			return fmt.Errorf("manifest %s: %w", desc.Digest, err)
		}
	}
	return nil
}

func alreadyExists(err error) bool { return errors.Is(err, errdef.ErrAlreadyExists) }

// PushAll pushes desc to every destination that lacks it (open gives its
// bytes, once per destination) and reports whether it pushed anywhere.
func PushAll(ctx context.Context, dsts []Dest, desc ocispec.Descriptor, open func() (io.Reader, error)) (bool, error) {
	pushed := false
	for _, d := range dsts {
		ok, err := d.Exists(ctx, desc)
		if err != nil {
			return false, err
		}
		if ok {
			continue
		}
		r, err := open()
		if err != nil {
			return false, err
		}
		err = d.Push(ctx, desc, r)
		if c, ok := r.(io.Closer); ok {
			c.Close()
		}
		if err != nil && !alreadyExists(err) {
			return false, err
		}
		pushed = true
	}
	return pushed, nil
}

// epoch is the time of every entry: the Unix epoch.
var epoch = time.Unix(0, 0).UTC()

// buildLayer writes the tar of entries, converts it to eStargz and pushes it.
func buildLayer(ctx context.Context, rd *FileReader, ver *layout.Version, entries []int, first bool, dsts []Dest, opt Options) (Layer, digest.Digest, error) {
	var l Layer
	tf, err := os.CreateTemp(opt.TempDir, "bdnvol-imageview-*.tar")
	if err != nil {
		return l, "", err
	}
	defer func() { tf.Close(); os.Remove(tf.Name()) }()
	tw := tar.NewWriter(tf)
	var prio []string
	if first {
		// The root directory and its parents.
		parts := strings.Split(opt.Root, "/")
		for i := range parts {
			if err := tw.WriteHeader(dirHeader(strings.Join(parts[:i+1], "/"), 0o755)); err != nil {
				return l, "", err
			}
		}
	}
	for _, i := range entries {
		if err := ctx.Err(); err != nil {
			return l, "", err
		}
		f := ver.Index.File(i)
		name := opt.Root + "/" + f.Path
		switch f.Type {
		case layout.TypeDir:
			err = tw.WriteHeader(dirHeader(name, int64(f.Mode&0o777)))
		case layout.TypeSymlink:
			err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: f.Target, Mode: 0o777, ModTime: epoch})
		case layout.TypeFile:
			if err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: f.Size, Mode: int64(f.Mode & 0o777), ModTime: epoch}); err == nil {
				err = rd.CopyFile(ctx, tw, f)
			}
			l.Files++
			l.Bytes += f.Size
			if first && priority(f.Path) >= 0 {
				prio = append(prio, name)
			}
		default:
			err = fmt.Errorf("%s: type %q", f.Path, f.Type)
		}
		if err != nil {
			return l, "", err
		}
	}
	if err := tw.Close(); err != nil {
		return l, "", err
	}
	size, err := tf.Seek(0, io.SeekCurrent)
	if err != nil {
		return l, "", err
	}
	slices.SortStableFunc(prio, func(a, b string) int {
		return cmp.Compare(priority(strings.TrimPrefix(a, opt.Root+"/")), priority(strings.TrimPrefix(b, opt.Root+"/")))
	})
	opts := []estargz.Option{
		estargz.WithContext(ctx),
		estargz.WithCompressionLevel(gzipLevel),
		estargz.WithChunkSize(tocChunk),
		estargz.WithParallelism(parallelism),
	}
	if len(prio) > 0 {
		opts = append(opts, estargz.WithPrioritizedFiles(prio))
	}
	blob, err := estargz.Build(io.NewSectionReader(tf, 0, size), opts...)
	if err != nil {
		return l, "", fmt.Errorf("estargz: %w", err)
	}
	// Write the blob to a second temporary file, then push that.
	bf, err := os.CreateTemp(opt.TempDir, "bdnvol-imageview-*.esgz")
	if err != nil {
		blob.Close()
		return l, "", err
	}
	defer func() { bf.Close(); os.Remove(bf.Name()) }()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(bf, h), blob)
	if cerr := blob.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return l, "", fmt.Errorf("estargz: %w", err)
	}
	usize, err := blob.UncompressedSize()
	if err != nil {
		return l, "", fmt.Errorf("estargz: %w", err)
	}
	l.Desc = ocispec.Descriptor{
		MediaType: ocispec.MediaTypeImageLayerGzip,
		Digest:    digest.NewDigestFromBytes(digest.SHA256, h.Sum(nil)),
		Size:      n,
		Annotations: map[string]string{
			AnnotationTOCDigest:        blob.TOCDigest().String(),
			AnnotationUncompressedSize: strconv.FormatInt(usize, 10),
		},
	}
	l.Uploaded, err = PushAll(ctx, dsts, l.Desc, func() (io.Reader, error) {
		return io.NewSectionReader(bf, 0, n), nil
	})
	if err != nil {
		return l, "", fmt.Errorf("push %s: %w", l.Desc.Digest, err)
	}
	return l, blob.DiffID(), nil
}

func dirHeader(name string, mode int64) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: epoch}
}

// FileReader reads the files of a version from its chunks, verifying each
// chunk and each whole file. It keeps the last chunk it fetched: files are
// read in index order, which is the order of the chunks' first use.
type FileReader struct {
	src  content.Fetcher
	ver  *layout.Version
	last int
	buf  []byte
}

// NewFileReader returns a FileReader of ver's files, whose chunks src serves.
func NewFileReader(src content.Fetcher, ver *layout.Version) *FileReader {
	if ver.Chunks == nil {
		src = ver.ChunkSource(src) // delta chunks decoded (and verified)
	}
	return &FileReader{src: src, ver: ver, last: -1}
}

func (r *FileReader) chunk(ctx context.Context, k int) ([]byte, error) {
	if k == r.last {
		return r.buf, nil
	}
	if k < 0 || k >= r.ver.NumChunks() {
		return nil, fmt.Errorf("chunk %d of %s: %w", k, r.ver.Root.Digest, layout.ErrInvalidIndex)
	}
	r.buf = nil
	b, err := verify.Fetch(ctx, r.src, "", r.ver.Chunk(k))
	if err != nil {
		return nil, fmt.Errorf("chunk %s of %s: %w", r.ver.Chunk(k).Digest, r.ver.Root.Digest, err)
	}
	r.last, r.buf = k, b
	return b, nil
}

// CopyFile writes the content of f to w; an error wrapping ErrCorrupt
// when it does not match its digest (after all of it was written).
func (r *FileReader) CopyFile(ctx context.Context, w io.Writer, f layout.File) error {
	h := sha256.New()
	var n int64
	for _, e := range f.Extents {
		b, err := r.chunk(ctx, e.Chunk)
		if err != nil {
			return err
		}
		if e.Offset < 0 || e.Length <= 0 || e.Offset+e.Length > int64(len(b)) {
			return fmt.Errorf("%s in %s: %w: extent out of its chunk", f.Path, r.ver.Root.Digest, layout.ErrInvalidIndex)
		}
		p := b[e.Offset : e.Offset+e.Length]
		h.Write(p)
		if _, err := w.Write(p); err != nil {
			return err
		}
		n += e.Length
	}
	if err := verify.Digest("file "+f.Path, ocispec.Descriptor{Digest: f.Digest, Size: f.Size}, digest.NewDigest(digest.SHA256, h), n); err != nil {
		return fmt.Errorf("%s: %w: %w", r.ver.Root.Digest, ErrCorrupt, err)
	}
	return nil
}
