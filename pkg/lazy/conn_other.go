//go:build !linux

package lazy

import (
	"errors"
	"log"
	"os"
	"time"
)

// errNoConn is what MountConn and ResumeConn return off Linux.
var errNoConn = errors.New("lazy: mounts that change hands need Linux")

// ConnOptions configure MountConn and ResumeConn.
type ConnOptions struct {
	AllowOther bool   // let other users read the mount
	UID, GID   uint32 // owner of every entry; 0 means root
	Logger     *log.Logger
}

// Conn is a FUSE mount that can change hands; Linux only.
type Conn struct {
	Mountpoint string
}

// MountConn fails off Linux.
func MountConn(dir string, v *Volume, opt ConnOptions) (*Conn, error) { return nil, errNoConn }

// ResumeConn fails off Linux.
func ResumeConn(master *os.File, init []byte, dir string, v *Volume, opt ConnOptions) (*Conn, error) {
	return nil, errNoConn
}

// Master returns nil off Linux.
func (c *Conn) Master() *os.File { return nil }

// Init returns nil off Linux.
func (c *Conn) Init() []byte { return nil }

// Done is never closed off Linux.
func (c *Conn) Done() <-chan struct{} { return nil }

// Drain does nothing off Linux.
func (c *Conn) Drain() {}

// Close does nothing off Linux.
func (c *Conn) Close() error { return nil }

// Unmount fails off Linux.
func (c *Conn) Unmount(busy time.Duration) error { return errNoConn }
