package pebble

import (
	"errors"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Table writes in large pieces
//
// Pebble writes a table through a 4 KiB bufio.Writer (objstorageprovider's
// fileBufferedWritable), so a flush or compaction makes one write(2) per
// 4 KiB, at offsets that leave block alignment as soon as a block larger
// than the buffer goes straight through. ext4 then zeroes the rest of each
// new block it half-writes (zero_user_segments) before the next write fills
// it. Near the end of a 2 GiB `bench grow` the tables' write(2) calls took
// 7.9% of the server's samples, 3.4% in that zeroing alone
// (docs/bench/writebuf-20261129/). tableWriteFS hands Pebble its tables
// behind a writeBufferSize buffer, so the kernel sees a few large writes.
//
// Invariants, kept by bufferedFile:
//  1. Bytes reach the file in the order Write received them: pending holds
//     only bytes that follow everything already written.
//  2. Every method that reads the file, reports its size, syncs it, writes
//     at an offset or closes it first writes out pending, so each behaves as
//     on the bare file; a Sync therefore covers every byte Write accepted.
//  3. A failed write-out leaves the bytes it did not write in pending and
//     returns the error; Pebble abandons a table on any write error.
//
// Concurrency: none. Pebble writes, syncs and closes a table from the one
// goroutine of its flush or compaction (vfs.NewSyncingFile's range syncs
// come from inside Write), so bufferedFile takes no lock.

// writeBufferSize is how much a table's writes gather before they reach the
// file: half of Pebble's BytesPerSync (512 KiB), so the background range
// syncs it asks for still find their data written.
const writeBufferSize = 256 << 10

// tableSuffixes name the files tableWriteFS buffers: Pebble's tables and
// blob files, written once from start to end. Every other file (the
// MANIFEST, OPTIONS, markers) is small and synced at once.
var tableSuffixes = []string{".sst", ".blob"}

// tableWriteFS is the file system Pebble is opened on: fs itself, except
// that a table created through it gathers its writes (bufferedFile).
type tableWriteFS struct {
	vfs.FS
}

// Create implements vfs.FS.
func (fs tableWriteFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil || !isTable(name) {
		return f, err
	}
	return &bufferedFile{File: f}, nil
}

// Unwrap implements vfs.FS.
func (fs tableWriteFS) Unwrap() vfs.FS { return fs.FS }

func isTable(name string) bool {
	for _, s := range tableSuffixes {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// bufferedFile is a file being written from start to end, whose Writes are
// held in pending until writeBufferSize of them have gathered.
type bufferedFile struct {
	vfs.File
	pending []byte // accepted by Write, not yet written to File
}

// Write implements vfs.File.
func (f *bufferedFile) Write(p []byte) (int, error) {
	if len(f.pending)+len(p) > writeBufferSize {
		if err := f.writeOut(); err != nil {
			return 0, err
		}
	}
	if len(p) >= writeBufferSize {
		return f.File.Write(p)
	}
	if f.pending == nil {
		f.pending = make([]byte, 0, writeBufferSize)
	}
	f.pending = append(f.pending, p...)
	return len(p), nil
}

// writeOut writes pending to the file (invariants 1 and 3).
func (f *bufferedFile) writeOut() error {
	if len(f.pending) == 0 {
		return nil
	}
	n, err := f.File.Write(f.pending)
	if err == nil && n < len(f.pending) {
		err = errors.New("short write")
	}
	f.pending = f.pending[:copy(f.pending, f.pending[n:])]
	return err
}

// Close implements vfs.File.
func (f *bufferedFile) Close() error {
	err := f.writeOut()
	return errors.Join(err, f.File.Close())
}

// Read implements vfs.File.
func (f *bufferedFile) Read(p []byte) (int, error) {
	if err := f.writeOut(); err != nil {
		return 0, err
	}
	return f.File.Read(p)
}

// ReadAt implements vfs.File.
func (f *bufferedFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.writeOut(); err != nil {
		return 0, err
	}
	return f.File.ReadAt(p, off)
}

// WriteAt implements vfs.File.
func (f *bufferedFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.writeOut(); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

// Stat implements vfs.File.
func (f *bufferedFile) Stat() (vfs.FileInfo, error) {
	if err := f.writeOut(); err != nil {
		return nil, err
	}
	return f.File.Stat()
}

// Sync implements vfs.File.
func (f *bufferedFile) Sync() error {
	if err := f.writeOut(); err != nil {
		return err
	}
	return f.File.Sync()
}

// SyncData implements vfs.File.
func (f *bufferedFile) SyncData() error {
	if err := f.writeOut(); err != nil {
		return err
	}
	return f.File.SyncData()
}

// SyncTo implements vfs.File.
func (f *bufferedFile) SyncTo(length int64) (bool, error) {
	if err := f.writeOut(); err != nil {
		return false, err
	}
	return f.File.SyncTo(length)
}
