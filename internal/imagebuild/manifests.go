package imagebuild

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// ImageName is the last path element of the repository of bdnvol's image.
const ImageName = "bdnvol"

// imageRE matches an image: value whose repository's last element is
// ImageName, with an optional tag and digest: 1 is what precedes the
// reference, 2 the repository, 3 the tag, 4 the digest, 5 what follows to
// the end of the line (a closing quote, a comment).
var imageRE = regexp.MustCompile(`(?m)^([ \t]*(?:-[ \t]+)?image:[ \t]*["']?)((?:[A-Za-z0-9][A-Za-z0-9._:/-]*/)?` + ImageName +
	`)(:[A-Za-z0-9_][A-Za-z0-9._-]*)?(@sha256:[0-9a-f]{64})?(["']?[ \t]*(?:#[^\n]*)?)$`)

// ImageRef is one reference to bdnvol's image in a manifest.
type ImageRef struct {
	Line   int
	Repo   string // the repository, without tag or digest
	Digest string // sha256:<hex>, or empty when it is not pinned
}

// FindImages returns the references to bdnvol's image in the YAML text b:
// every image: value whose repository ends in /bdnvol.
func FindImages(b []byte) []ImageRef {
	var out []ImageRef
	for _, m := range imageRE.FindAllSubmatchIndex(b, -1) {
		r := ImageRef{Line: 1 + strings.Count(string(b[:m[0]]), "\n"), Repo: string(b[m[4]:m[5]])}
		if m[8] >= 0 {
			r.Digest = string(b[m[8]+1 : m[9]])
		}
		out = append(out, r)
	}
	return out
}

// RewriteImages returns b with every reference to bdnvol's image (as
// FindImages finds them) replaced by REPO@DIGEST, where REPO is repo, or the
// reference's own repository when repo is empty; every other byte stays.
// It also returns how many references it rewrote.
func RewriteImages(b []byte, repo, digest string) ([]byte, int) {
	n := 0
	out := imageRE.ReplaceAllFunc(b, func(m []byte) []byte {
		n++
		s := imageRE.FindSubmatch(m)
		r := repo
		if r == "" {
			r = string(s[2])
		}
		return []byte(string(s[1]) + r + "@" + digest + string(s[5]))
	})
	return out, n
}

// RewriteManifests applies RewriteImages to every *.yaml file in dir,
// writing only the files that change, and returns how many references it
// found. A directory without any reference to bdnvol's image is an error,
// and so is a repo whose last element is not ImageName (a later rewrite
// would not find it).
func RewriteManifests(dir, repo, digest string) (int, error) {
	if repo != "" && !strings.HasSuffix("/"+repo, "/"+ImageName) {
		return 0, fmt.Errorf("image repository %s: its last element must be %s", repo, ImageName)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return 0, err
	}
	total := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return total, err
		}
		out, n := RewriteImages(b, repo, digest)
		total += n
		if string(out) == string(b) {
			continue
		}
		st, err := os.Stat(f)
		if err != nil {
			return total, err
		}
		if err := os.WriteFile(f, out, st.Mode().Perm()); err != nil {
			return total, err
		}
	}
	if total == 0 {
		return 0, fmt.Errorf("%s: no image: reference to a repository named %s", dir, ImageName)
	}
	return total, nil
}

// CheckManifests returns an error naming each reference to bdnvol's image
// in dir/*.yaml that is not pinned to digest.
func CheckManifests(dir, digest string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	var bad []string
	total := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		for _, r := range FindImages(b) {
			total++
			if r.Digest != digest {
				got := r.Digest
				if got == "" {
					got = "no digest"
				}
				bad = append(bad, fmt.Sprintf("%s:%d: %s has %s, the build gives %s", f, r.Line, r.Repo, got, digest))
			}
		}
	}
	if total == 0 {
		return fmt.Errorf("%s: no image: reference to a repository named %s", dir, ImageName)
	}
	if len(bad) > 0 {
		return fmt.Errorf("manifests not pinned to the built image (run make deploy-manifests):\n%s", strings.Join(bad, "\n"))
	}
	return nil
}
