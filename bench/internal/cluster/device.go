package cluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Bytes written to the device
//
// /proc/PID/io write_bytes is not the volume a process sends to the disk.
// The kernel adds the size of a page-cache folio each time a write makes a
// clean folio dirty (folio_account_dirtied), and since Linux 6.x file
// systems such as ext4 cache files in large folios (up to megabytes, sized
// by the writes or the read-ahead that created them). A 272-byte append
// plus fdatasync into a file that was created by 1 MiB writes is then
// counted as 1 MiB, although the file system writes back only the 4 KiB
// block that changed: measured on ext4 under Linux 6.18, 3,000 such appends
// gave write_bytes = 3 GiB and 13 MiB of device writes (docs/bench/).
//
// The device's own counter is exact but not per process: it is read from
// /sys/dev/block/MAJ:MIN/stat (sectors written, always 512-byte units) for
// the block device that holds the cluster directory, after a syncfs of that
// file system, so that the delta between two samples holds everything the
// server had written by then, file-system journal included, plus whatever
// other processes wrote to the same device meanwhile. On a quiet machine it
// is the server's; on a shared one it is an upper bound.

// sectorBytes is the unit of the sector counters in /sys/block/*/stat,
// fixed by the kernel whatever the device's real sector size.
const sectorBytes = 512

// device reads the write counter of the block device holding a directory.
type device struct {
	dir  string // a directory on the device, for syncfs
	stat string // /sys/dev/block/MAJ:MIN/stat
	name string // for notes, e.g. "/sys/dev/block/253:0"
}

// errNoDevice is returned by findDevice when the directory's file system
// has no block device of its own (tmpfs, overlayfs, network file systems).
var errNoDevice = errors.New("no block device")

// findDevice returns the block device that holds dir.
func findDevice(dir string) (*device, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", dir, err)
	}
	base := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	p := base + "/stat"
	if _, err := os.Stat(p); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s (device %d:%d): %w", dir, unix.Major(st.Dev), unix.Minor(st.Dev), errNoDevice)
		}
		return nil, fmt.Errorf("device of %s: %w", dir, err)
	}
	return &device{dir: dir, stat: p, name: base}, nil
}

// writtenBytes syncs the file system of d.dir and returns the bytes the
// device has written since boot.
func (d *device) writtenBytes() (int64, error) {
	f, err := os.Open(d.dir)
	if err != nil {
		return 0, fmt.Errorf("open %s for syncfs: %w", d.dir, err)
	}
	err = unix.Syncfs(int(f.Fd()))
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("syncfs %s: %w", d.dir, err)
	}
	b, err := os.ReadFile(d.stat)
	if err != nil {
		return 0, fmt.Errorf("read device stat: %w", err)
	}
	sectors, err := parseSectorsWritten(b)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", d.stat, err)
	}
	return sectors * sectorBytes, nil
}

// parseSectorsWritten returns field 7 (sectors written) of a block device's
// stat file (Documentation/block/stat.rst: reads, read merges, sectors read,
// read ticks, writes, write merges, sectors written, ...).
func parseSectorsWritten(b []byte) (int64, error) {
	f := strings.Fields(string(b))
	if len(f) < 7 {
		return 0, fmt.Errorf("parse block stat: %d fields, want >= 7", len(f))
	}
	v, err := strconv.ParseInt(f[6], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse sectors written %q: %w", f[6], err)
	}
	return v, nil
}
