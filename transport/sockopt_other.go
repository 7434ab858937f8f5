//go:build !unix

package transport

import (
	"errors"
	"syscall"
)

// control refuses socket options where strata does not set them.
func (c ListenConfig) control(_, _ string, _ syscall.RawConn) error {
	return errors.New("--socket-reuse-port and --socket-reuse-address are supported on unix only")
}
