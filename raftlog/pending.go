package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// A snapshot install spans two stores: the state machine's engine takes the
// snapshot, then the log restarts after it (ApplySnapshot). A crash, or a
// stop, between the two left an engine whose applied index is past the
// log's last index, and the log could not tell what to restart after: the
// snapshot's term is known only from the snapshot. And after the restart
// the engine may still be past the log's end (a full snapshot carries the
// leader's engine past the snapshot's index) until the log has received
// the entries up to the engine's index. So the node records the snapshot's
// metadata before the install (BeginSnapshot) and removes the record
// (ForgetPendingSnapshot) only once the log holds every entry up to the
// engine's applied index; at start-up, with a record left, the node
// finishes the install (restarts the log after the snapshot) if the engine
// took it, and accepts an engine past the log's end (FORMAT.md, "Pending
// snapshot"; node.reconcileSnapshot).
//
// The record is a file, pendingSnapshotName in the first directory, written
// whole (temporary name, fsync, rename, directory fsync): a crash leaves
// either no record or a complete one. Its bytes: a 4-byte little-endian
// CRC-32C of the rest, then the SnapshotMetadata's protobuf encoding.

const pendingSnapshotName = "snapshot.pending"

// BeginSnapshot durably records meta as a snapshot about to be installed
// into the state machine, replacing any earlier record.
func (l *Log) BeginSnapshot(meta *raftpb.SnapshotMetadata) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.checkWritable(); err != nil {
		return err
	}
	raw, err := proto.Marshal(meta)
	if err != nil {
		return fmt.Errorf("raftlog: record pending snapshot %d: %w", meta.GetIndex(), err)
	}
	buf := binary.LittleEndian.AppendUint32(nil, crc32.Checksum(raw, castagnoli))
	buf = append(buf, raw...)
	dir := l.w.lanes[0].dir
	if err := writeFileAtomic(l.fs, dir, pendingSnapshotName, buf); err != nil {
		return fmt.Errorf("raftlog: record pending snapshot %d: %w", meta.GetIndex(), err)
	}
	l.w.pending = proto.CloneOf(meta)
	return nil
}

// PendingSnapshot returns the snapshot BeginSnapshot recorded and no
// ForgetPendingSnapshot has removed since, or nil.
func (l *Log) PendingSnapshot() *raftpb.SnapshotMetadata {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.w.pending
}

// ForgetPendingSnapshot removes the record: the state machine never took
// the snapshot, or the log now holds every entry up to the state
// machine's applied index.
func (l *Log) ForgetPendingSnapshot() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.clearPendingLocked()
}

// clearPendingLocked removes the pending snapshot record, durably.
// REQUIRES: l.wmu held.
func (l *Log) clearPendingLocked() error {
	if l.w.pending == nil {
		return nil
	}
	dir := l.w.lanes[0].dir
	if err := l.fs.Remove(l.fs.PathJoin(dir, pendingSnapshotName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("raftlog: remove pending snapshot record: %w", err)
	}
	if err := syncDir(l.fs, dir); err != nil {
		return fmt.Errorf("raftlog: remove pending snapshot record: %w", err)
	}
	l.w.pending = nil
	return nil
}

// loadPendingSnapshot reads the pending snapshot record at Open, if any.
func (l *Log) loadPendingSnapshot() error {
	dir := l.w.lanes[0].dir
	path := l.fs.PathJoin(dir, pendingSnapshotName)
	_ = l.fs.Remove(path + tempSuffix) // a record whose rename never happened
	f, err := l.fs.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("raftlog: open %s: %w", path, err)
	}
	buf, err := io.ReadAll(f)
	_ = f.Close()
	if err != nil {
		return fmt.Errorf("raftlog: read %s: %w", path, err)
	}
	if len(buf) < 4 || binary.LittleEndian.Uint32(buf) != crc32.Checksum(buf[4:], castagnoli) {
		return fmt.Errorf("%w: %s: checksum mismatch", ErrCorrupt, path)
	}
	meta := &raftpb.SnapshotMetadata{}
	if err := proto.Unmarshal(buf[4:], meta); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	l.w.pending = meta
	return nil
}

// writeFileAtomic writes data as dir/name: a temporary file, fsynced, then
// renamed, then the directory fsynced.
func writeFileAtomic(fs vfs.FS, dir, name string, data []byte) error {
	path := fs.PathJoin(dir, name)
	tmp := path + tempSuffix
	if err := writeNewFile(fs, tmp, data, 0); err != nil {
		_ = fs.Remove(tmp)
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := fs.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return syncDir(fs, dir)
}
