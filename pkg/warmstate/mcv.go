package warmstate

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// Model Cache Vault's "compat" cache image (redhat-et/MCU,
// mcv/docs/spec-compat.md): one gzip tar layer holding the cache under
// io.<type>.cache/ and a manifest under io.<type>.manifest/, described by
// labels on the image config.
const (
	MCVTypeVLLM   = "vllm"
	MCVTypeTriton = "triton"
	// MediaTypeDockerLayer is the Docker layer type compat images may use.
	MediaTypeDockerLayer = "application/vnd.docker.image.rootfs.diff.tar.gzip"
	// LabelKey carries a companion's key on an exported image, so that an
	// import finds it again.
	LabelKey = AnnotationKey
)

// MCV bounds of an import.
const (
	MaxMCVEntries = 1 << 20 // tar entries of a layer
)

// ErrMCV is wrapped when an image is not a compat cache image bdnvol reads.
var ErrMCV = errors.New("not a Model Cache Vault compat image")

func mcvPrefix(kind string) (string, error) {
	switch kind {
	case MCVTypeVLLM, MCVTypeTriton:
		return "io." + kind + ".cache", nil
	}
	return "", fmt.Errorf("cache type %q: want %s or %s", kind, MCVTypeVLLM, MCVTypeTriton)
}

// ExportMCV writes the cache tree in dir (regular files, directories and
// symbolic links; nothing beneath it followed) to t as a compat image of
// type kind ("vllm" or "triton") whose config carries key in LabelKey, and
// returns the image manifest's descriptor (untagged). The same tree gives
// the same digest: entries in path order, owner 0, times zero.
func ExportMCV(ctx context.Context, t oci.Target, dir, kind string, key Key) (ocispec.Descriptor, error) {
	prefix, err := mcvPrefix(kind)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	tmp, err := os.CreateTemp("", "bdnvol-mcv-*.tar.gz")
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	zh, uh := sha256.New(), sha256.New()
	zc := &countWriter{w: io.MultiWriter(tmp, zh)}
	gz, _ := gzip.NewWriterLevel(zc, gzip.DefaultCompression)
	tw := tar.NewWriter(io.MultiWriter(gz, uh))
	var size, entries int64
	top := map[string]bool{}
	format := "binary"
	epoch := time.Unix(0, 0)
	add := func(h *tar.Header) error {
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.ModTime, h.AccessTime, h.ChangeTime = epoch, time.Time{}, time.Time{}
		h.Format = tar.FormatPAX
		return tw.WriteHeader(h)
	}
	if err := add(&tar.Header{Typeflag: tar.TypeDir, Name: prefix + "/", Mode: 0o755}); err != nil {
		return ocispec.Descriptor{}, err
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		name := prefix + "/" + rel
		first, _, _ := strings.Cut(rel, "/")
		if kind == MCVTypeVLLM && strings.HasPrefix(rel, "torch_compile_cache/") {
			if h, _, ok := strings.Cut(strings.TrimPrefix(rel, "torch_compile_cache/"), "/"); ok || d.IsDir() {
				first = "torch_compile_cache/" + h
			}
		}
		if path.Base(rel) == "triton_cache" {
			format = "triton"
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return add(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: int64(info.Mode().Perm())})
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return add(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
		case d.Type().IsRegular():
			top[first] = true
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := add(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(info.Mode().Perm()), Size: info.Size()}); err != nil {
				return err
			}
			n, err := io.Copy(tw, f)
			if err == nil && n != info.Size() {
				err = fmt.Errorf("%s changed while it was exported", p)
			}
			size += n
			entries++
			return err
		}
		return fmt.Errorf("%s: not a regular file, directory or symbolic link", p)
	})
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	mb, _ := json.Marshal(map[string]any{kind: []any{}, "bdnvolKey": key.String()})
	if err := add(&tar.Header{Typeflag: tar.TypeDir, Name: "io." + kind + ".manifest/", Mode: 0o755}); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := add(&tar.Header{Typeflag: tar.TypeReg, Name: "io." + kind + ".manifest/manifest.json", Mode: 0o644, Size: int64(len(mb))}); err != nil {
		return ocispec.Descriptor{}, err
	}
	if _, err := tw.Write(mb); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := tw.Close(); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := gz.Close(); err != nil {
		return ocispec.Descriptor{}, err
	}
	layer := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip,
		Digest: digest.NewDigest(digest.SHA256, zh), Size: zc.n}
	diffID := digest.NewDigest(digest.SHA256, uh)
	count := len(top)
	if kind == MCVTypeVLLM {
		count = 0
		for k := range top {
			if strings.HasPrefix(k, "torch_compile_cache/") {
				count++
			}
		}
		if count == 0 {
			count = len(top)
		}
	}
	summary := `{"targets":[]}`
	if cc := key[FieldCC]; cc != "" {
		b, _ := json.Marshal(map[string]any{"targets": []any{map[string]any{"backend": "cuda", "arch": "sm_" + strings.ReplaceAll(cc, ".", ""), "warp_size": 32}}})
		summary = string(b)
	}
	labels := map[string]string{
		"cache." + kind + ".image/entry-count":      strconv.Itoa(count),
		"cache." + kind + ".image/cache-size-bytes": strconv.FormatInt(size, 10),
		"cache." + kind + ".image/summary":          summary,
		"model.cache.image/type":                    kind,
		LabelKey:                                    key.String(),
	}
	if kind == MCVTypeVLLM {
		labels["cache.vllm.image/format"] = format
	}
	cfg := ocispec.Image{
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		Config:   ocispec.ImageConfig{Labels: labels},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{diffID}},
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	cd := content.NewDescriptorFromBytes(ocispec.MediaTypeImageConfig, cb)
	m := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: cd, Layers: []ocispec.Descriptor{layer},
		Annotations: map[string]string{"cache." + kind + ".image/variant": "compat"},
	}
	m.Config.Data = nil
	mbytes, err := json.Marshal(m)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	md := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, mbytes)
	if ok, err := t.Exists(ctx, layer); err != nil || !ok {
		if _, err := tmp.Seek(0, io.SeekStart); err != nil {
			return ocispec.Descriptor{}, err
		}
		if err := t.Push(ctx, layer, tmp); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
			return ocispec.Descriptor{}, fmt.Errorf("push layer: %w", err)
		}
	}
	if err := pushBytes(ctx, t, cd, cb); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := pushBytes(ctx, t, md, mbytes); err != nil {
		return ocispec.Descriptor{}, err
	}
	return md, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// MCVImage is a compat image read by ImportMCV.
type MCVImage struct {
	Desc   ocispec.Descriptor
	Type   string // vllm or triton
	Key    Key    // from LabelKey; nil when the image has none
	Files  int64
	Bytes  int64
	Labels map[string]string
}

// ImportMCV extracts the cache of the compat image desc in t into dir,
// which must be empty or missing: the files under io.<type>.cache/, at
// their paths below it. The manifest directory is skipped; a symbolic or
// hard link, a device, a path that is absolute or climbs out, more than
// MaxMCVEntries entries or more than maxBytes bytes is refused, and so is
// a layer whose bytes do not match its digest or a size that disagrees
// with the image's cache-size-bytes label. On error dir may hold part of
// the tree: extract into a directory of its own.
func ImportMCV(ctx context.Context, t oci.Target, desc ocispec.Descriptor, dir string, maxBytes int64) (*MCVImage, error) {
	if desc.Size <= 0 || desc.Size > oci.MaxManifestBytes {
		return nil, fmt.Errorf("%w: manifest of %d bytes", ErrMCV, desc.Size)
	}
	mb, err := verify.Fetch(ctx, t, "", desc)
	if err != nil {
		return nil, err
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(mb, &m); err != nil || m.Config.Size <= 0 || m.Config.Size > oci.MaxManifestBytes {
		return nil, fmt.Errorf("%w: %s: unreadable manifest or config", ErrMCV, desc.Digest)
	}
	if len(m.Layers) != 1 || (m.Layers[0].MediaType != ocispec.MediaTypeImageLayerGzip && m.Layers[0].MediaType != MediaTypeDockerLayer) {
		return nil, fmt.Errorf("%w: %s: want one layer of %s or %s", ErrMCV, desc.Digest, ocispec.MediaTypeImageLayerGzip, MediaTypeDockerLayer)
	}
	cb, err := verify.Fetch(ctx, t, "", m.Config)
	if err != nil {
		return nil, err
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(cb, &cfg); err != nil {
		return nil, fmt.Errorf("%w: config: %v", ErrMCV, err)
	}
	img := &MCVImage{Desc: desc, Labels: cfg.Config.Labels}
	for _, kind := range []string{MCVTypeVLLM, MCVTypeTriton} {
		for l := range img.Labels {
			if strings.HasPrefix(l, "cache."+kind+".image/") {
				img.Type = kind
			}
		}
	}
	if img.Type == "" {
		img.Type = img.Labels["model.cache.image/type"]
	}
	prefix, err := mcvPrefix(img.Type)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: no cache.vllm.image/ or cache.triton.image/ label", ErrMCV, desc.Digest)
	}
	if s := img.Labels[LabelKey]; s != "" {
		if img.Key, err = ParseKey(s); err != nil {
			return nil, fmt.Errorf("%w: %s: label %s: %w", ErrMCV, desc.Digest, LabelKey, err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if es, err := os.ReadDir(dir); err != nil || len(es) > 0 {
		return nil, fmt.Errorf("%s: not an empty directory", dir)
	}
	rc, err := t.Fetch(ctx, m.Layers[0])
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	vr := verify.Reader(rc, "layer", m.Layers[0])
	gz, err := gzip.NewReader(vr)
	if err != nil {
		return nil, fmt.Errorf("%w: layer: %v", ErrMCV, err)
	}
	tr := tar.NewReader(gz)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: layer: %v", ErrMCV, err)
		}
		if n++; n > MaxMCVEntries {
			return nil, fmt.Errorf("%w: more than %d entries", ErrMCV, MaxMCVEntries)
		}
		name := strings.TrimPrefix(h.Name, "./")
		rel, ok := strings.CutPrefix(name, prefix+"/")
		if !ok {
			if strings.TrimSuffix(name, "/") == prefix {
				continue
			}
			continue // the manifest directory, or another type's
		}
		rel = strings.TrimSuffix(rel, "/")
		if rel == "" {
			continue
		}
		if !fs.ValidPath(rel) || strings.Contains(rel, "\\") {
			return nil, fmt.Errorf("%w: entry %q climbs out or is not a clean path", ErrMCV, h.Name)
		}
		p := filepath.Join(dir, filepath.FromSlash(rel))
		mode := fs.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return nil, err
			}
			if err := os.Chmod(p, mode|0o700); err != nil {
				return nil, err
			}
		case tar.TypeReg:
			if img.Bytes+h.Size > maxBytes {
				return nil, fmt.Errorf("%w: more than %d bytes", ErrMCV, maxBytes)
			}
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return nil, err
			}
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, mode|0o600)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrMCV, h.Name, err)
			}
			w, err := io.Copy(f, io.LimitReader(tr, h.Size))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil && w != h.Size {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrMCV, h.Name, err)
			}
			if err := os.Chmod(p, mode); err != nil {
				return nil, err
			}
			img.Files++
			img.Bytes += w
		default:
			return nil, fmt.Errorf("%w: entry %q: type %q (only files and directories are imported)", ErrMCV, h.Name, h.Typeflag)
		}
	}
	// The digest is checked at the layer's end: read what tar left.
	if _, err := io.Copy(io.Discard, gz); err != nil {
		return nil, fmt.Errorf("%w: layer: %v", ErrMCV, err)
	}
	if _, err := io.Copy(io.Discard, vr); err != nil {
		return nil, err
	}
	if s, ok := img.Labels["cache."+img.Type+".image/cache-size-bytes"]; ok && s != strconv.FormatInt(img.Bytes, 10) {
		return nil, fmt.Errorf("%w: %d bytes extracted, the label says %s", ErrMCV, img.Bytes, s)
	}
	return img, nil
}

// noFollow refuses a symbolic link where a file is created.
const noFollow = syscall.O_NOFOLLOW
