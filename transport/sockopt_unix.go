//go:build unix

package transport

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// control sets the socket options of c on a listening socket.
func (c ListenConfig) control(_, _ string, raw syscall.RawConn) error {
	var sockErr error
	err := raw.Control(func(fd uintptr) {
		if c.ReuseAddress {
			if sockErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); sockErr != nil {
				return
			}
		}
		if c.ReusePort {
			sockErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}
	})
	if err != nil {
		return err
	}
	return sockErr
}
