package main

import (
	"errors"
	"path/filepath"

	"github.com/bdnvol/bdnvol/pkg/mounts"
	"github.com/bdnvol/bdnvol/pkg/signature"
	"github.com/bdnvol/bdnvol/pkg/versions"
)

// errNoMountpoint is returned when a single version is to be mounted but
// no mountpoint is given.
var errNoMountpoint = errors.New("expected REF MOUNTPOINT, or --spec FILE ROOT")

// errSpecMountpoint is returned when a deploy file is mounted and a
// mountpoint is given besides its root.
var errSpecMountpoint = errors.New("with --spec, give only the root directory")

// mountTargets turns what `bdnvol mount` is given into what to mount, and the
// directory the daemon's log is named after: the version ref (a tag or a
// digest) at mountpoint, or with specFile (a deploy file, see mounts.FromSpec)
// its mounts under the root directory ref. A signature by key ("" for
// none) is required.
func mountTargets(ref, mountpoint, specFile, key string, warn func(format string, args ...any)) ([]mounts.Target, string, error) {
	if specFile == "" {
		if mountpoint == "" {
			return nil, "", errNoMountpoint
		}
		r, err := versions.ParseRef(ref)
		if err != nil {
			return nil, "", err
		}
		mp, err := filepath.Abs(mountpoint)
		if err != nil {
			return nil, "", err
		}
		policy, err := signature.LoadPolicy(key)
		if err != nil {
			return nil, "", err
		}
		return []mounts.Target{{Ref: r, Mountpoint: mp, Policy: policy}}, mp, nil
	}
	if mountpoint != "" {
		return nil, "", errSpecMountpoint
	}
	root, err := filepath.Abs(ref)
	if err != nil {
		return nil, "", err
	}
	targets, err := mounts.FromSpec(specFile, root, key, warn)
	if err != nil {
		return nil, "", err
	}
	return targets, root, nil
}
