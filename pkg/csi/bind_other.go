//go:build !linux

package csi

import (
	"errors"
	"fmt"
)

// errNotLinux is returned where the node plugin cannot work.
var errNotLinux = errors.New("the CSI node plugin runs on Linux only")

func bindReadOnly(src, target string) error {
	return fmt.Errorf("bind %s at %s: %w", src, target, errNotLinux)
}

func unbind(target string) error { return fmt.Errorf("unmount %s: %w", target, errNotLinux) }
