// Command mkimage builds bdnvol's container image without a container
// runtime (make image): static bdnvol binaries for each platform, one layer
// each on an empty base, as a multi-platform index written to an OCI layout;
// it prints the index digest, and can push the index, pin the Kubernetes
// manifests to it, or check that they are pinned to it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/bdnvol/bdnvol/internal/imagebuild"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	out := fs.String("out", "dist/image", "the OCI layout to write (replaced)")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "comma-separated OS/ARCH list")
	version := fs.String("version", "dev", "the version built into the binary (main.version) and the image label")
	pkg := fs.String("pkg", "./cmd/bdnvol", "the package to build")
	push := fs.String("push", "", "push the index to this reference (HOST/REPO:TAG) too")
	manifests := fs.String("manifests", "", "rewrite the bdnvol image references in DIR/*.yaml to the built digest")
	repo := fs.String("image-repo", "", "with -manifests: also replace the repository of those references")
	check := fs.String("check", "", "fail unless every bdnvol image reference in DIR/*.yaml is pinned to the built digest")
	if err := fs.Parse(args); err != nil {
		return err
	}
	created, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "mkimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var bins []imagebuild.Binary
	for _, p := range strings.Split(*platforms, ",") {
		goos, goarch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || goos == "" || goarch == "" {
			return fmt.Errorf("platform %q: want OS/ARCH", p)
		}
		b, err := build(ctx, *pkg, goos, goarch, *version, filepath.Join(tmp, goos+"-"+goarch))
		if err != nil {
			return err
		}
		bins = append(bins, imagebuild.Binary{OS: goos, Arch: goarch, Data: b})
	}
	idx, err := imagebuild.Index(bins, imagebuild.Options{Created: created, Version: *version})
	if err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	if err := imagebuild.WriteLayout(*out, idx, *version); err != nil {
		return err
	}
	if *manifests != "" {
		n, err := imagebuild.RewriteManifests(*manifests, *repo, d.String())
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "mkimage: %d image references in %s pinned to %s\n", n, *manifests, d)
	}
	if *check != "" {
		if err := imagebuild.CheckManifests(*check, d.String()); err != nil {
			return err
		}
	}
	if *push != "" {
		ref, err := name.ParseReference(*push)
		if err != nil {
			return fmt.Errorf("push %s: %w", *push, err)
		}
		if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("push %s: %w", *push, err)
		}
		fmt.Println(ref.Context().Name() + "@" + d.String())
		return nil
	}
	fmt.Println(d)
	return nil
}

// build compiles pkg statically for goos/goarch into out and returns the
// binary. The flags leave out everything that differs between machines and
// checkouts: paths, build IDs, VCS stamps, symbol tables.
func build(ctx context.Context, pkg, goos, goarch, version, out string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -buildid= -X main.version="+version, "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch, "GOFLAGS=")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build %s for %s/%s: %w", pkg, goos, goarch, err)
	}
	return os.ReadFile(out)
}

// sourceDateEpoch returns the time SOURCE_DATE_EPOCH names, or the zero
// time (the Unix epoch in the image) when it is not set.
func sourceDateEpoch() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
	}
	return time.Unix(n, 0).UTC(), nil
}
