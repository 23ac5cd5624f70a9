//go:build !linux

package csi

import (
	"errors"
	"fmt"
)

// errNotLinux is returned where the node plugin cannot work.
var errNotLinux = errors.New("the CSI node plugin runs on Linux only")

// targetDir is a target path; outside Linux nothing can be done there.
type targetDir struct{ path string }

func openTarget(_, tp string) (*targetDir, error) {
	return nil, fmt.Errorf("target %s: %w", tp, errNotLinux)
}

func (d *targetDir) Close()                        {}
func (d *targetDir) check() error                  { return errNotLinux }
func (d *targetDir) bind(src string) (bool, error) { return false, errNotLinux }
func (d *targetDir) unbind() error                 { return errNotLinux }
func (d *targetDir) rmdir(bool) error              { return errNotLinux }
func (d *targetDir) at() string                    { return d.path }
func (d *targetDir) overlay(_, _, _ string) error  { return errNotLinux }

// mountAt reports nothing mounted: the plugin runs on Linux only.
func mountAt(string) (string, bool) { return "", false }
