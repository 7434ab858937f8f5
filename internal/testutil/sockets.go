package testutil

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// socketOwner returns the PID, among pids, of the process holding the
// dialer's end of a loopback TCP connection the proxy accepted: the socket
// whose local address is accepted's remote and whose remote address is
// accepted's local. It reads /proc/net/tcp for that socket's inode, then
// each candidate's /proc/<pid>/fd for the inode. Linux only; ok is false
// if no candidate holds the socket (it closed, or it belongs to another
// process).
//
// Both ends are matched because the dialer's address alone does not name
// one socket: Linux gives the same ephemeral port to connections with
// different destinations, and an earlier connection from the same port can
// still sit in TIME_WAIT (listed with inode 0) while the table is read.
func socketOwner(accepted net.Conn, pids []int) (pid int, ok bool) {
	dialer, isTCP := accepted.RemoteAddr().(*net.TCPAddr)
	proxied, isTCP2 := accepted.LocalAddr().(*net.TCPAddr)
	if !isTCP || !isTCP2 || dialer.IP.To4() == nil || proxied.IP.To4() == nil {
		return 0, false
	}
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return 0, false
	}
	inode, err := socketInode(f, dialer, proxied)
	f.Close()
	if err != nil || inode == "" {
		return 0, false
	}
	want := "socket:[" + inode + "]"
	for _, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if link, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && link == want {
				return pid, true
			}
		}
	}
	return 0, false
}

// socketInode finds, in a table in /proc/net/tcp's format ("sl local rem
// st ... uid timeout inode"), the inode of the IPv4 TCP socket from local
// to remote that a process still holds. "" if there is none: a socket in
// TIME_WAIT, or one being torn down, is listed with inode 0.
func socketInode(table io.Reader, local, remote *net.TCPAddr) (string, error) {
	wantLocal, wantRemote := procTCPAddr(local), procTCPAddr(remote)
	sc := bufio.NewScanner(table)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[1] != wantLocal || fields[2] != wantRemote || fields[9] == "0" {
			continue
		}
		return fields[9], nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read /proc/net/tcp: %w", err)
	}
	return "", nil
}

// procTCPAddr prints an IPv4 address as /proc/net/tcp does: the in-memory
// 32-bit word in hex (so on little-endian machines the bytes appear
// reversed), a colon, the port in hex.
func procTCPAddr(a *net.TCPAddr) string {
	ip := a.IP.To4()
	return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], a.Port)
}
