// Package imagebuild makes bdnvol's container image without a container
// runtime: a static binary at /bdnvol in one layer on an empty base, every
// timestamp, owner and mode fixed, so that the same binaries always give the
// same digest. It writes the image as an OCI layout and rewrites the image
// references of Kubernetes manifests to that digest.
package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BinaryPath is where the binary lies in the image, and its entrypoint.
const BinaryPath = "/bdnvol"

// ErrNoBinaries is returned when there is nothing to put in an image.
var ErrNoBinaries = errors.New("no binaries")

// Binary is a static bdnvol executable built for one platform.
type Binary struct {
	OS, Arch string
	Data     []byte
}

// Options say what goes into the image besides the binaries.
type Options struct {
	Created time.Time // image creation time and every file's mtime; the zero value means the Unix epoch
	Version string    // the org.opencontainers.image.version label; empty leaves it out
	Source  string    // the org.opencontainers.image.source label; empty leaves it out
}

func (o Options) created() time.Time {
	if o.Created.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return o.Created.UTC()
}

// Layer returns the one layer of an image: the directory /tmp (mode 1777,
// for temporary files) and bin as /bdnvol (mode 0755), owned by root, with
// mtime mtime, as a gzip-compressed tar that depends on nothing else.
func Layer(bin []byte, mtime time.Time) (v1.Layer, error) {
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	hdrs := []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777},
		{Typeflag: tar.TypeReg, Name: BinaryPath[1:], Mode: 0o755, Size: int64(len(bin))},
	}
	for _, h := range hdrs {
		h.ModTime = mtime
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer %s: %w", h.Name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(bin); err != nil {
				return nil, fmt.Errorf("layer %s: %w", h.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	// The gzip header keeps its zero ModTime and empty name.
	if _, err := zw.Write(tb.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	data := gz.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	// Only the v1.Layer methods: the tarball layer's own descriptor carries an
	// empty annotations map that does not survive a manifest round trip.
	return struct{ v1.Layer }{l}, nil
}

// Image returns the image of one binary: its layer on an empty base, with
// the binary's platform, entrypoint /bdnvol and the creation time of opt.
func Image(b Binary, opt Options) (v1.Image, error) {
	created := opt.created()
	layer, err := Layer(b.Data, created)
	if err != nil {
		return nil, fmt.Errorf("image %s/%s: %w", b.OS, b.Arch, err)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "bdnvol mkimage: " + BinaryPath, Comment: "static bdnvol binary"},
	})
	if err != nil {
		return nil, fmt.Errorf("image %s/%s: %w", b.OS, b.Arch, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s/%s: %w", b.OS, b.Arch, err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = b.OS, b.Arch
	cf.Created = v1.Time{Time: created}
	cf.Config.Entrypoint = []string{BinaryPath}
	cf.Config.Env = []string{"PATH=/"}
	cf.Config.Labels = labels(opt)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image %s/%s: %w", b.OS, b.Arch, err)
	}
	return img, nil
}

func labels(opt Options) map[string]string {
	l := map[string]string{}
	if opt.Version != "" {
		l["org.opencontainers.image.version"] = opt.Version
	}
	if opt.Source != "" {
		l["org.opencontainers.image.source"] = opt.Source
	}
	if len(l) == 0 {
		return nil
	}
	return l
}

// Index returns the multi-platform image index of bins, one image per
// binary, ordered by OS and architecture so that the order of bins does not
// change the digest.
func Index(bins []Binary, opt Options) (v1.ImageIndex, error) {
	if len(bins) == 0 {
		return nil, ErrNoBinaries
	}
	bins = append([]Binary(nil), bins...)
	sort.Slice(bins, func(i, j int) bool {
		if bins[i].OS != bins[j].OS {
			return bins[i].OS < bins[j].OS
		}
		return bins[i].Arch < bins[j].Arch
	})
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for i, b := range bins {
		if i > 0 && b.OS == bins[i-1].OS && b.Arch == bins[i-1].Arch {
			return nil, fmt.Errorf("platform %s/%s given twice", b.OS, b.Arch)
		}
		img, err := Image(b, opt)
		if err != nil {
			return nil, err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: b.OS, Architecture: b.Arch}},
		})
	}
	return idx, nil
}

// WriteLayout replaces dir with an OCI image layout whose index.json names
// idx, annotated with refName (org.opencontainers.image.ref.name) when it is
// not empty.
func WriteLayout(dir string, idx v1.ImageIndex, refName string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("layout %s: %w", dir, err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("layout %s: %w", dir, err)
	}
	var opts []layout.Option
	if refName != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": refName}))
	}
	if err := p.AppendIndex(idx, opts...); err != nil {
		return fmt.Errorf("layout %s: %w", dir, err)
	}
	return nil
}

// ReadLayout returns the image index that WriteLayout wrote to dir.
func ReadLayout(dir string) (v1.ImageIndex, error) {
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("layout %s: %w", dir, err)
	}
	im, err := top.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("layout %s: %w", dir, err)
	}
	if len(im.Manifests) != 1 || !im.Manifests[0].MediaType.IsIndex() {
		return nil, fmt.Errorf("layout %s: want one image index in index.json, found %d entries", dir, len(im.Manifests))
	}
	idx, err := top.ImageIndex(im.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("layout %s: %w", dir, err)
	}
	return idx, nil
}
