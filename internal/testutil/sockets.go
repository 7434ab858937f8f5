package testutil

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// socketOwner returns the PID, among pids, of the process holding the
// local end of a loopback TCP connection whose other end is at remote (as
// a proxy sees an accepted connection: remote is the dialer's address).
// It reads /proc/net/tcp for the socket's inode, then each candidate's
// /proc/<pid>/fd for that inode. Linux only; ok is false if no candidate
// holds the socket (it closed, or it belongs to another process).
func socketOwner(remote net.Addr, pids []int) (pid int, ok bool) {
	tcp, isTCP := remote.(*net.TCPAddr)
	if !isTCP || tcp.IP.To4() == nil {
		return 0, false
	}
	inode, err := socketInode(tcp)
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

// socketInode finds the inode of the IPv4 TCP socket whose local address
// is local, in /proc/net/tcp ("sl local rem st ... uid timeout inode").
func socketInode(local *net.TCPAddr) (string, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return "", fmt.Errorf("socket owner: %w", err)
	}
	defer f.Close()
	ip := local.IP.To4()
	// The kernel prints the address as the in-memory 32-bit word in hex,
	// so on little-endian machines the bytes appear reversed.
	want := fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], local.Port)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[1] != want {
			continue
		}
		if _, err := strconv.ParseUint(fields[9], 10, 64); err == nil {
			return fields[9], nil
		}
	}
	return "", sc.Err()
}
