package imageview

import (
	"errors"
	"fmt"
	"strings"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// ErrPlatform is wrapped when a platform is not OS/ARCH.
var ErrPlatform = errors.New("want OS/ARCH")

// ErrDestinationDigest is wrapped when the destination of an image view
// names a digest.
var ErrDestinationDigest = errors.New("an image reference takes a tag, not a digest")

// ParsePlatform splits a platform, OS/ARCH, as `--platform` takes it.
func ParsePlatform(s string) (osName, arch string, err error) {
	osName, arch, ok := strings.Cut(s, "/")
	if !ok || osName == "" || arch == "" || strings.Contains(arch, "/") {
		return "", "", fmt.Errorf("--platform %q: %w", s, ErrPlatform)
	}
	return osName, arch, nil
}

// ParseDestination parses where Export pushes an image view: HOST/REPO[:TAG]
// or oci:PATH[:TAG], never a digest; "" is the zero Ref (the volume's
// repository, untagged).
func ParseDestination(s string) (oci.Ref, error) {
	if s == "" {
		return oci.Ref{}, nil
	}
	dst, err := oci.ParseRef(s)
	if err != nil {
		return dst, err
	}
	if dst.Digest != "" {
		return dst, fmt.Errorf("%s: %w", s, ErrDestinationDigest)
	}
	return dst, nil
}
