//go:build !linux

package mounts

import "errors"

// connOf has no FUSE connection to name outside Linux.
func connOf(string) string { return "" }

// abortConn is not possible outside Linux: there is no fusectl.
func abortConn(string) error { return errors.New("aborting a FUSE connection needs Linux fusectl") }
