package csi

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// The fd protocol: how mounts (a FUSE master descriptor and what is needed
// to go on serving it) pass between a mounter, its successor and the fd
// holder, over a unix socket. A message is a 4-byte big-endian length and
// that many bytes of JSON (an fdMessage); a message that carries a
// descriptor has it attached (SCM_RIGHTS) to its bytes, one at most.
//
//	successor → predecessor: hello, take; ← mount+fd ..., end
//	mounter → holder:        hello; put+fd | drop | list (← mount+fd ..., end) | hello; each ← ok or error

// fdProtoVersion is the protocol's version; a peer speaking another is
// refused.
const fdProtoVersion = 1

// maxFDMessage bounds a message's JSON.
const maxFDMessage = 64 << 10

// fdIOTimeout bounds the read of a message once its first byte arrived,
// and every write.
const fdIOTimeout = 10 * time.Second

// Operations of the fd protocol.
const (
	opHello = "hello" // first message of a connection; answered with ok
	opTake  = "take"  // successor to predecessor: hand every mount over
	opPut   = "put"   // mounter to holder: keep this mount's descriptor (replacing one of the same key)
	opDrop  = "drop"  // mounter to holder: forget mount Key
	opList  = "list"  // mounter to holder: send every mount held
	opMount = "mount" // one mount and its descriptor, in answer to take or list
	opEnd   = "end"   // no more mounts
	opOK    = "ok"
	opError = "error"
)

// fdMessage is one message of the fd protocol.
type fdMessage struct {
	V     int        `json:"v"`
	Op    string     `json:"op"`
	Mount *heldMount `json:"mount,omitempty"`
	Key   string     `json:"key,omitempty"`
	Error string     `json:"error,omitempty"`
}

// heldMount is what a process needs to go on serving a mount whose master
// descriptor it receives.
type heldMount struct {
	Key        string      `json:"key"`        // the mount key (MountKey)
	Ref        string      `json:"ref"`        // the digest-pinned reference it was mounted for
	Mountpoint string      `json:"mountpoint"` // where it is mounted
	Prefetch   string      `json:"prefetch,omitempty"`
	Auth       *credential `json:"auth,omitempty"`       // the credential it fetches with, as the mount holds it
	IndexKeys  []string    `json:"index_keys,omitempty"` // the keys it trusts a published ModelPack index by
	Init       []byte      `json:"init"`                 // the kernel's INIT request body (lazy.Conn.Init)
}

// String names the mount, never its credential.
func (h *heldMount) String() string { return h.Key + " at " + h.Mountpoint }

// errFDProto is wrapped by every refusal of a malformed message.
var errFDProto = errors.New("fd protocol")

// check refuses a message that is not well formed for its operation, and
// tells whether it must carry a descriptor.
func (m *fdMessage) check() (wantFD bool, err error) {
	if m.V != fdProtoVersion {
		return false, fmt.Errorf("%w: version %d, want %d", errFDProto, m.V, fdProtoVersion)
	}
	switch m.Op {
	case opPut, opMount:
		h := m.Mount
		if h == nil || h.Key == "" || keyOfPinned(h.Ref) == "" || !filepath.IsAbs(h.Mountpoint) ||
			filepath.Clean(h.Mountpoint) != h.Mountpoint || len(h.Init) < 8 {
			return true, fmt.Errorf("%w: %s: incomplete mount", errFDProto, m.Op)
		}
		return true, nil
	case opDrop:
		if m.Key == "" {
			return false, fmt.Errorf("%w: drop with no key", errFDProto)
		}
		return false, nil
	case opHello, opTake, opList, opEnd, opOK, opError:
		return false, nil
	}
	return false, fmt.Errorf("%w: unknown operation %q", errFDProto, m.Op)
}

// writeFD sends m, with f's descriptor attached when f is not nil.
func writeFD(c *net.UnixConn, m fdMessage, f *os.File) error {
	m.V = fdProtoVersion
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(body) > maxFDMessage {
		return fmt.Errorf("%w: %s message of %d bytes (at most %d)", errFDProto, m.Op, len(body), maxFDMessage)
	}
	buf := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body)))
	buf = append(buf, body...)
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	c.SetWriteDeadline(time.Now().Add(fdIOTimeout))
	defer c.SetWriteDeadline(time.Time{})
	n, _, err := c.WriteMsgUnix(buf, oob, nil)
	if err != nil {
		return err
	}
	if n < len(buf) {
		// The descriptor went with the first bytes; the rest is plain.
		if _, err := c.Write(buf[n:]); err != nil {
			return err
		}
	}
	return nil
}

// readFD reads one message and the descriptor it carries (nil when none).
// A message that is too long, malformed, or carries a descriptor it should
// not (or more than one) is refused, and every descriptor received with it
// closed.
func readFD(c *net.UnixConn) (fdMessage, *os.File, error) {
	var fds []int
	fail := func(err error) (fdMessage, *os.File, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return fdMessage{}, nil, err
	}
	oob := make([]byte, unix.CmsgSpace(4*4))
	read := func(buf []byte, first bool) error {
		for got := 0; got < len(buf); {
			if !first || got > 0 {
				c.SetReadDeadline(time.Now().Add(fdIOTimeout))
			}
			n, oobn, _, _, err := c.ReadMsgUnix(buf[got:], oob)
			if oobn > 0 {
				cms, perr := unix.ParseSocketControlMessage(oob[:oobn])
				for _, cm := range cms {
					if r, err := unix.ParseUnixRights(&cm); err == nil {
						fds = append(fds, r...)
					}
				}
				if perr != nil {
					return fmt.Errorf("%w: control message: %v", errFDProto, perr)
				}
			}
			if err != nil {
				return err
			}
			if n == 0 {
				return errors.New("connection closed mid-message")
			}
			got += n
		}
		return nil
	}
	defer c.SetReadDeadline(time.Time{})
	var hdr [4]byte
	if err := read(hdr[:], true); err != nil {
		return fail(err)
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size == 0 || size > maxFDMessage {
		return fail(fmt.Errorf("%w: message of %d bytes (at most %d)", errFDProto, size, maxFDMessage))
	}
	body := make([]byte, size)
	if err := read(body, false); err != nil {
		return fail(err)
	}
	var m fdMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return fail(fmt.Errorf("%w: %v", errFDProto, err))
	}
	wantFD, err := m.check()
	if err != nil {
		return fail(err)
	}
	switch {
	case len(fds) > 1:
		return fail(fmt.Errorf("%w: %s with %d descriptors", errFDProto, m.Op, len(fds)))
	case wantFD && len(fds) == 0:
		return fail(fmt.Errorf("%w: %s with no descriptor", errFDProto, m.Op))
	case !wantFD && len(fds) > 0:
		return fail(fmt.Errorf("%w: %s with a descriptor", errFDProto, m.Op))
	}
	if !wantFD {
		return m, nil, nil
	}
	unix.CloseOnExec(fds[0])
	return m, os.NewFile(uintptr(fds[0]), "/dev/fuse"), nil
}

// call sends m (with f) and reads the answer, which must be ok.
func call(c *net.UnixConn, m fdMessage, f *os.File) error {
	if err := writeFD(c, m, f); err != nil {
		return err
	}
	r, rf, err := readFD(c)
	if rf != nil {
		rf.Close()
	}
	if err != nil {
		return err
	}
	if r.Op != opOK {
		return fmt.Errorf("%s: %s %s", m.Op, r.Op, r.Error)
	}
	return nil
}

// listenFD listens on the unix socket at path for the fd protocol (0600,
// replacing a stale socket).
func listenFD(path string) (*net.UnixListener, error) {
	l, err := Listen(path)
	if err != nil {
		return nil, err
	}
	return l.(*net.UnixListener), nil
}

// dialFD connects to the fd protocol's socket at path.
func dialFD(path string) (*net.UnixConn, error) {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}
