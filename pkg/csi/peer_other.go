//go:build !linux

package csi

import (
	"fmt"
	"net"
)

// checkPeer refuses every peer off Linux: mounts change hands on Linux only.
func checkPeer(c *net.UnixConn) error {
	return fmt.Errorf("%w: Linux only", errFDProto)
}
