package snapshot

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
)

// A backup, in the format the Maintenance service's Snapshot RPC streamed
// before it streamed etcd's own (package etcddb), and which strata restore
// still reads: a snapshot stream (the format above),
// zero padding to a multiple of BackupAlign bytes, then the SHA-256 of
// everything before it. The shape is etcd's (a bbolt file, whose size is a
// multiple of its page size, followed by its SHA-256): etcdctl accepts a
// download only if its size modulo 512 is 32, and etcdutl checks the
// digest before restoring. See FORMAT.md.

// BackupAlign is the size the body of a backup is padded to.
const BackupAlign = 512

// ErrBackupChecksum marks a backup whose SHA-256 trailer does not match.
var ErrBackupChecksum = errors.New("snapshot: backup sha256 mismatch")

// countingWriter counts and hashes what passes through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// WriteBackup writes a backup to w: the snapshot stream of the records
// forEach produces (see Write), padding, and the SHA-256 trailer. It
// returns the bytes written.
func WriteBackup(w io.Writer, appliedIndex uint64, forEach func(fn func(key, value []byte) error) error) (int64, error) {
	h := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(w, h)}
	if err := Write(cw, appliedIndex, forEach); err != nil {
		return cw.n, err
	}
	if pad := (BackupAlign - cw.n%BackupAlign) % BackupAlign; pad > 0 {
		if _, err := cw.Write(make([]byte, pad)); err != nil {
			return cw.n, err
		}
	}
	n, err := w.Write(h.Sum(nil))
	return cw.n + int64(n), err
}

// ReadBackup checks the backup's size and SHA-256 trailer, then decodes its
// snapshot stream into sink. r holds size bytes. Nothing reaches sink
// unless the digest matches, so a damaged download is refused before any
// byte of it is installed.
func ReadBackup(r io.ReaderAt, size int64, sink Sink) (appliedIndex, records uint64, err error) {
	if size < BackupAlign+sha256.Size || size%BackupAlign != sha256.Size {
		return 0, 0, fmt.Errorf("%w: backup of %d bytes: want a multiple of %d plus a %d-byte sha256", ErrCorrupt, size, BackupAlign, sha256.Size)
	}
	body := size - sha256.Size
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(r, 0, body)); err != nil {
		return 0, 0, fmt.Errorf("read backup: %w", err)
	}
	want := make([]byte, sha256.Size)
	if _, err := r.ReadAt(want, body); err != nil {
		return 0, 0, fmt.Errorf("read backup digest: %w", err)
	}
	if !bytes.Equal(h.Sum(nil), want) {
		return 0, 0, ErrBackupChecksum
	}
	return Read(io.NewSectionReader(r, 0, body), sink)
}
