package raftlog

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/internal/failpoint"
)

// DefaultSegmentSize is the preallocated size of a segment when
// Options.SegmentSize is 0.
const DefaultSegmentSize = 64 << 20

// minSegmentSize keeps tests' tiny segments sane.
const minSegmentSize = 4 << 10

var (
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("raftlog: log closed")
	// ErrFailed wraps the first write or sync error; the Log refuses every
	// later write, because after a failed fsync the state of the file is
	// unknown and retrying could acknowledge lost data.
	ErrFailed = errors.New("raftlog: log failed, refusing writes")
)

// Options configures Open.
type Options struct {
	// FS is the file system all log I/O goes through (vfs.Default in
	// production, vfs.NewCrashableMem in crash tests).
	FS vfs.FS
	// Dirs are the log directories. Exactly one is supported today; the
	// segment code takes its directory as a parameter so that several
	// directories written in parallel fit later (DESIGN.md).
	Dirs []string
	// SegmentSize is the preallocated size of a segment; 0 means
	// DefaultSegmentSize. A batch larger than a segment goes into a segment
	// of its own, which grows past this size.
	SegmentSize int64
	// Logger receives recovery warnings; nil means zap.NewNop().
	Logger *zap.Logger

	// tailBudget overrides the in-memory tail budget (tests).
	tailBudget int
}

// Stats are counters for metrics.
type Stats struct {
	Segments      int           // live segment files
	Bytes         int64         // bytes written in live segments (frames, not preallocation)
	DiskBytes     int64         // bytes the live segments occupy, preallocation included
	Appends       uint64        // Append calls that wrote
	Entries       uint64        // entries written by Append
	BytesWritten  uint64        // bytes written by Append, Compact and ApplySnapshot
	Fsyncs        uint64        // fdatasyncs of segment files
	FsyncDuration time.Duration // total time spent in those fdatasyncs
}

// Log is strata's raft log: raft.Storage for reads, Append for writes.
//
// Concurrency: the raft.Storage methods, Stats and Inspect are safe from any
// goroutine, concurrently with writes. Append, Compact, ApplySnapshot and
// Close must be called from one goroutine at a time (the node goroutine).
// Append starts at most one goroutine at a time, which prepares the spare
// file for the next segment (prepareSpare); the writer collects it when it
// rolls to a new segment, and Close waits for it. Open starts none.
// No lock is held across a write or sync: the writer builds and syncs its
// frame, then takes mu only to publish the new state, so readers never wait
// for the disk and never see an entry before it is durable.
//
// Invariants:
//  1. An entry or HardState is visible to readers only after the fdatasync
//     that made it durable returned.
//  2. Every segment opens with a state frame holding the snapshot point and
//     HardState current when it was created, so deleting older segments
//     never loses them.
//  3. Segments are deleted oldest first, and only when every entry in them
//     is at or below the snapshot point (see Compact).
//  4. After a failed write or sync, no further write is attempted.
type Log struct {
	fs      vfs.FS
	dir     string
	segSize int64
	budget  int // in-memory tail budget
	logger  *zap.Logger

	// w is owned by the writer goroutine. The writer may read mem without
	// mu, since only it changes mem.
	w struct {
		active  *segment
		off     int64 // where the next frame goes in active
		opened  int64 // offset just past active's opening state frame
		nextSeq uint64
		buf     []byte
		failed  error
		// spare delivers the spare segment file being prepared; nil if
		// none is under way.
		spare      chan spareResult
		spareCount uint64 // spares prepared so far, for unique names
	}

	mu struct {
		sync.RWMutex
		mem    *memState  // guarded by mu
		segs   []*segment // live segments, oldest first; guarded by mu
		closed bool       // guarded by mu
	}

	stats struct {
		appends, entries, bytes, fsyncs, fsyncNanos atomic.Uint64
	}
}

// Open opens the log in opts.Dirs, creating it if empty, and recovers it
// as FORMAT.md describes.
func Open(opts Options) (*Log, error) {
	if opts.FS == nil {
		return nil, errors.New("raftlog: Options.FS is nil")
	}
	if len(opts.Dirs) != 1 {
		return nil, fmt.Errorf("raftlog: %d log directories given; exactly one is supported", len(opts.Dirs))
	}
	l := &Log{fs: opts.FS, dir: opts.Dirs[0], segSize: opts.SegmentSize, logger: opts.Logger, budget: opts.tailBudget}
	if l.budget == 0 {
		l.budget = tailBudget
	}
	if l.segSize == 0 {
		l.segSize = DefaultSegmentSize
	}
	l.segSize = int64(padded(int(max(l.segSize, minSegmentSize))))
	if l.logger == nil {
		l.logger = zap.NewNop()
	}
	if err := ensureDir(l.fs, l.dir); err != nil {
		return nil, err
	}
	if err := l.recover(); err != nil {
		l.closeSegments()
		return nil, err
	}
	return l, nil
}

// recover replays every segment into a fresh memState (FORMAT.md,
// "Recovery") and prepares the last segment for appending.
func (l *Log) recover() error {
	names, temps, err := listSegments(l.fs, l.dir)
	if err != nil {
		return err
	}
	for _, t := range temps {
		// A crash while creating a segment: it was never renamed into place.
		if err := l.fs.Remove(l.fs.PathJoin(l.dir, t)); err != nil {
			return fmt.Errorf("remove temporary file %s: %w", t, err)
		}
	}
	m := newMemState()
	m.budget = l.budget
	l.mu.mem = m
	if len(names) == 0 {
		return l.startSegment(1, 1, logState{cs: m.cs})
	}
	var last scanResult
	for i, name := range names {
		isLast := i == len(names)-1
		path := l.fs.PathJoin(l.dir, name)
		var f vfs.File
		if isLast {
			f, err = l.fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
		} else {
			f, err = l.fs.Open(path)
		}
		if err != nil {
			return fmt.Errorf("open segment %s: %w", name, err)
		}
		seg := &segment{dir: l.dir, name: name, f: f}
		seg.refs.Store(1)
		l.mu.segs = append(l.mu.segs, seg)
		res, err := scanSegment(f, name, isLast, func(off int64, typ byte, payload []byte) error {
			return replayFrame(m, seg, off, typ, payload)
		})
		if err != nil {
			return err
		}
		seg.hdr, seg.end, seg.frames = res.hdr, res.end, res.frames
		last = res
	}
	if m.pos.len() > 0 && m.first != m.snapIndex+1 {
		return fmt.Errorf("%w: entries %d..%d are missing (snapshot at %d, log resumes at %d)",
			ErrCorrupt, m.snapIndex+1, m.first-1, m.snapIndex, m.first)
	}
	m.first = m.snapIndex + 1
	seg := l.mu.segs[len(l.mu.segs)-1]
	if last.dirtyEnd > last.end {
		l.logger.Warn("raftlog: truncating torn tail of last segment",
			zap.String("file", l.fs.PathJoin(l.dir, seg.name)),
			zap.Int64("offset", last.end),
			zap.Int64("garbage_end", last.dirtyEnd),
			zap.Uint64("last_good_index", m.last()),
			zap.String("reason", last.tornReason))
		// Zero the garbage so that the frames appended next are never
		// followed by stale bytes that a later recovery would misread.
		if err := zeroRange(seg.f, last.end, last.dirtyEnd); err != nil {
			return fmt.Errorf("truncate torn tail of %s at offset %d: %w", seg.name, last.end, err)
		}
	}
	l.w.active, l.w.off, l.w.opened = seg, last.end, last.firstFrames
	l.w.nextSeq = seg.hdr.seq + 1
	return nil
}

// ensureDir creates dir and any missing parents durably: each directory it
// creates is made permanent by syncing its parent, or a power cut could
// take the whole log with it.
func ensureDir(fs vfs.FS, dir string) error {
	var missing []string
	for d := dir; ; d = fs.PathDir(d) {
		if _, err := fs.Stat(d); err == nil {
			break
		}
		missing = append(missing, d)
		if fs.PathDir(d) == d {
			break
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create log dir %s: %w", dir, err)
	}
	for _, d := range missing {
		if err := syncDir(fs, fs.PathDir(d)); err != nil {
			return fmt.Errorf("create log dir %s: %w", dir, err)
		}
	}
	return nil
}

// replayFrame applies one verified frame to m during recovery.
func replayFrame(m *memState, seg *segment, off int64, typ byte, payload []byte) error {
	switch typ {
	case frameState:
		st, err := decodeStatePayload(payload)
		if err != nil {
			return err
		}
		m.hs = st.hs
		switch {
		case st.reset:
			m.reset(st.snapIndex, st.snapTerm, st.cs)
		case st.snapIndex > m.snapIndex || m.snapIndex == 0:
			m.compact(st.snapIndex, st.snapTerm, st.cs)
		}
	case frameBatch:
		// The payload buffer is reused by the scanner: copy what the tail
		// may keep.
		b, err := decodeBatchPayload(append([]byte(nil), payload...))
		if err != nil {
			return err
		}
		if b.hasHS {
			m.hs = b.hs
		}
		m.appendEntries(b.entries, seg, off)
		seg.frames++
		seg.entries += len(b.entries)
		if n := len(b.entries); n > 0 {
			seg.lastIndex = max(seg.lastIndex, b.entries[n-1].GetIndex())
		}
	}
	return nil
}

// zeroRange overwrites [from, to) of f with zeros and syncs it.
func zeroRange(f vfs.File, from, to int64) error {
	zeros := make([]byte, min(scanChunk, to-from))
	for off := from; off < to; {
		n := min(int64(len(zeros)), to-off)
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			return err
		}
		off += n
	}
	return f.SyncData()
}

// startSegment creates segment seq, opening with state st, and makes it
// the active segment. It uses the spare file if one is being prepared
// (waiting for it if need be) and starts preparing the next one.
func (l *Log) startSegment(seq, firstIndex uint64, st logState) error {
	spare := ""
	if l.w.spare != nil {
		r := <-l.w.spare
		l.w.spare = nil
		if r.err == nil {
			spare = r.path
		} else {
			// Not fatal: nothing of the log was touched. Create the
			// segment the slow way, which reports a real problem.
			l.logger.Warn("raftlog: preparing a spare segment failed", zap.Error(r.err))
			_ = l.fs.Remove(r.path)
		}
	}
	seg, err := createSegment(l.fs, l.dir, seq, firstIndex, l.segSize, spare, func(buf []byte, salt uint64) ([]byte, error) {
		return appendStateFrame(buf, salt, st)
	})
	if err != nil {
		return err
	}
	seg.frames = 1
	l.mu.Lock()
	l.mu.segs = append(l.mu.segs, seg)
	l.mu.Unlock()
	l.w.active, l.w.off, l.w.opened = seg, seg.end, seg.end
	l.w.nextSeq = seq + 1
	l.stats.bytes.Add(uint64(seg.end))
	return nil
}

// spareResult is the outcome of preparing a spare segment file.
type spareResult struct {
	path string
	err  error
}

// prepareSpare starts preparing, in a goroutine, the file the next segment
// will use: created under a temporary name, zero-filled to the segment
// size and synced, so that rolling to a new segment costs one small write
// and sync instead of writing a whole segment inside Append. The writer
// collects the result in startSegment or Close.
func (l *Log) prepareSpare() {
	if l.w.spare != nil || l.w.failed != nil {
		return
	}
	ch := make(chan spareResult, 1)
	l.w.spare = ch
	l.w.spareCount++
	path := l.fs.PathJoin(l.dir, spareName(l.w.spareCount))
	fs, size := l.fs, l.segSize
	go func() {
		ch <- spareResult{path: path, err: writeNewFile(fs, path, nil, size)}
	}()
}

// currentState is the state frame that opens a new segment.
func (l *Log) currentState() logState {
	m := l.mu.mem
	return logState{snapIndex: m.snapIndex, snapTerm: m.snapTerm, hs: m.hs, cs: m.cs}
}

// checkWritable reports why the log cannot be written, if it cannot.
func (l *Log) checkWritable() error {
	if l.w.failed != nil {
		return fmt.Errorf("%w: %w", ErrFailed, l.w.failed)
	}
	l.mu.RLock()
	closed := l.mu.closed
	l.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	return nil
}

// Append durably writes entries and hs (either may be empty) with one write
// and one fdatasync, and returns once they are durable. Entries must be
// consecutive; an entry at or below LastIndex replaces the log from its
// index on (raft conflict resolution); entries at or below the snapshot
// point are ignored, as raft.MemoryStorage does. The log keeps references
// to the entries (not copies): callers must not modify them afterwards,
// which raft never does.
//
// An error from the write or the sync is returned and the Log refuses all
// later writes (ErrFailed): the caller must restart from disk.
func (l *Log) Append(entries []*raftpb.Entry, hs *raftpb.HardState) error {
	if err := l.checkWritable(); err != nil {
		return err
	}
	for i, e := range entries {
		if want := entries[0].GetIndex() + uint64(i); e.GetIndex() != want {
			return fmt.Errorf("raftlog: append: entry at position %d has index %d, want %d", i, e.GetIndex(), want)
		}
	}
	m := l.mu.mem
	withHS := !raft.IsEmptyHardState(hs)
	if n := len(entries); n > 0 && entries[n-1].GetIndex() <= m.snapIndex {
		entries = nil
	} else if n > 0 && entries[0].GetIndex() <= m.snapIndex {
		entries = entries[m.snapIndex+1-entries[0].GetIndex():]
	}
	if len(entries) == 0 && !withHS {
		return nil
	}
	first := m.last() + 1
	if len(entries) > 0 {
		first = entries[0].GetIndex()
		if first > m.last()+1 {
			return fmt.Errorf("raftlog: append at index %d leaves a gap after last index %d", first, m.last())
		}
	}
	if size := batchPayloadSize(entries, withHS); size > MaxFrameSize {
		return fmt.Errorf("raftlog: append of %d entries is %d bytes, above the frame limit %d", len(entries), size, MaxFrameSize)
	}
	var h hardState
	if withHS {
		h = hardStateOf(hs)
	}
	frameLen := int64(frameHeaderSize + padded(batchPayloadSize(entries, withHS)))
	if err := l.rollIfFull(frameLen, first); err != nil {
		return err
	}
	seg, off := l.w.active, l.w.off
	l.w.buf = appendBatchFrame(l.w.buf[:0], seg.hdr.salt, entries, withHS, h)
	if err := l.writeAndSync(l.w.buf); err != nil {
		return err
	}

	l.mu.Lock()
	m.appendEntries(entries, seg, off)
	if withHS {
		m.hs = h
	}
	seg.end = l.w.off
	seg.frames++
	seg.entries += len(entries)
	if n := len(entries); n > 0 {
		seg.lastIndex = max(seg.lastIndex, entries[n-1].GetIndex())
	}
	l.mu.Unlock()
	l.stats.appends.Add(1)
	l.stats.entries.Add(uint64(len(entries)))
	l.prepareSpare()
	return nil
}

// rollIfFull starts a new segment if a frame of frameLen bytes does not fit
// in the active one and the active one holds more than its opening state.
// firstIndex names the new segment.
func (l *Log) rollIfFull(frameLen int64, firstIndex uint64) error {
	if l.w.off+frameLen <= l.segSize || l.w.off <= l.w.opened {
		return nil
	}
	if err := l.startSegment(l.w.nextSeq, firstIndex, l.currentState()); err != nil {
		l.w.failed = err
		return fmt.Errorf("raftlog: roll to a new segment: %w", err)
	}
	return nil
}

// writeAndSync writes buf at the end of the active segment and fdatasyncs
// it. Any error marks the log failed.
func (l *Log) writeAndSync(buf []byte) error {
	seg := l.w.active
	if _, err := seg.f.WriteAt(buf, l.w.off); err != nil {
		l.w.failed = fmt.Errorf("write %s at offset %d: %w", seg.name, l.w.off, err)
		return fmt.Errorf("raftlog: %w", l.w.failed)
	}
	failpoint.Hit("raftlog/before-sync")
	start := time.Now()
	err := seg.f.SyncData()
	l.stats.fsyncNanos.Add(uint64(time.Since(start)))
	l.stats.fsyncs.Add(1)
	if err != nil {
		l.w.failed = fmt.Errorf("fdatasync %s: %w", seg.name, err)
		return fmt.Errorf("raftlog: %w", l.w.failed)
	}
	failpoint.Hit("raftlog/after-sync")
	l.w.off += int64(len(buf))
	l.stats.bytes.Add(uint64(len(buf)))
	return nil
}

// Compact records that every entry <= index is held elsewhere (durably in
// the engine, DESIGN.md rule 4) and that raft's snapshot point is (index,
// term of index, cs; a nil cs keeps the current ConfState). It writes and
// syncs a state frame, then deletes the oldest segments while every entry
// in them is <= index.
//
// The caller guarantees index <= the engine's durable applied index, hence
// committed. The log cannot check that against its HardState, whose commit
// index lags when commit-only HardStates are not synced (the node's
// policy); instead Compact raises the stored commit index to index, which
// raft requires at restart (commit >= snapshot index). It returns
// raft.ErrCompacted if index is at or below the snapshot point and an
// error if index is beyond LastIndex.
func (l *Log) Compact(index uint64, cs *raftpb.ConfState) error {
	if err := l.checkWritable(); err != nil {
		return err
	}
	m := l.mu.mem
	switch {
	case index <= m.snapIndex:
		return raft.ErrCompacted
	case index > m.last():
		return fmt.Errorf("raftlog: log compaction to %d beyond last index %d", index, m.last())
	}
	term := m.pos.at(int(index - m.first)).term
	if cs == nil {
		cs = m.cs
	}
	cs = proto.CloneOf(raftpb.EnsureConfState(cs))
	// The caller guarantees index <= the engine's durable applied index, so
	// index is committed. The stored commit may lag (a commit-only HardState
	// is not synced), and raft refuses to start with a commit below the
	// snapshot point: raise it.
	hs := m.hs
	hs.commit = max(hs.commit, index)
	st := logState{snapIndex: index, snapTerm: term, hs: hs, cs: cs}
	var err error
	if l.w.buf, err = appendStateFrame(l.w.buf[:0], l.w.active.hdr.salt, st); err != nil {
		return fmt.Errorf("raftlog: log compaction to %d: %w", index, err)
	}
	if l.w.off+int64(len(l.w.buf)) > l.segSize && l.w.off > l.w.opened {
		// The new segment opens with this very state.
		err = l.startSegment(l.w.nextSeq, m.last()+1, st)
		if err != nil {
			l.w.failed = err
			return fmt.Errorf("raftlog: log compaction to %d: %w", index, err)
		}
	} else {
		if err := l.writeAndSync(l.w.buf); err != nil {
			return err
		}
		l.mu.Lock()
		l.w.active.frames++
		l.mu.Unlock()
	}
	l.mu.Lock()
	m.compact(index, term, cs)
	m.hs = hs
	l.w.active.end = l.w.off
	l.mu.Unlock()
	return l.deleteSegments(func(s *segment) bool { return s.lastIndex <= index })
}

// deleteSegments removes the oldest segments, other than the active one,
// while drop accepts them, then syncs the directory. The state that makes
// them unnecessary is durable before this is called; a crash in between
// leaves files that the next recovery replays harmlessly.
func (l *Log) deleteSegments(drop func(*segment) bool) error {
	l.mu.Lock()
	n := 0
	for n < len(l.mu.segs)-1 && l.mu.segs[n] != l.w.active && drop(l.mu.segs[n]) {
		n++
	}
	doomed := append([]*segment(nil), l.mu.segs[:n]...)
	l.mu.segs = shrink(l.mu.segs, n)
	l.mu.Unlock()
	if len(doomed) == 0 {
		return nil
	}
	var errs []error
	for _, s := range doomed {
		if err := l.fs.Remove(s.path(l.fs)); err != nil {
			errs = append(errs, fmt.Errorf("remove segment %s: %w", s.name, err))
		}
		s.release() // readers still holding it keep the file open
	}
	if err := syncDir(l.fs, l.dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("raftlog: delete compacted segments: %w", err)
	}
	return nil
}

// ApplySnapshot discards the whole log and restarts it after meta's index:
// a follower installed a snapshot. It creates a new segment opening with a
// reset state frame, then deletes every older segment. The HardState's
// commit index is raised to the snapshot index if below it. It returns
// raft.ErrSnapOutOfDate if meta is not newer than the snapshot point.
func (l *Log) ApplySnapshot(meta *raftpb.SnapshotMetadata) error {
	if err := l.checkWritable(); err != nil {
		return err
	}
	m := l.mu.mem
	index, term := meta.GetIndex(), meta.GetTerm()
	if index <= m.snapIndex {
		return raft.ErrSnapOutOfDate
	}
	cs := proto.CloneOf(raftpb.EnsureConfState(meta.GetConfState()))
	hs := m.hs
	hs.commit = max(hs.commit, index)
	st := logState{reset: true, snapIndex: index, snapTerm: term, hs: hs, cs: cs}
	old := l.w.active
	if err := l.startSegment(l.w.nextSeq, index+1, st); err != nil {
		l.w.failed = err
		return fmt.Errorf("raftlog: apply snapshot at %d: %w", index, err)
	}
	l.mu.Lock()
	m.reset(index, term, cs)
	m.hs = hs
	l.mu.Unlock()
	return l.deleteSegments(func(s *segment) bool { return s.hdr.seq <= old.hdr.seq })
}

// Close closes the log. Reads and writes after Close return ErrClosed.
// Everything Append returned for is already durable; Close syncs nothing.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.mu.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	l.mu.closed = true
	l.mu.Unlock()
	if l.w.spare != nil {
		// Wait for the preparing goroutine; Open would delete the file.
		r := <-l.w.spare
		l.w.spare = nil
		_ = l.fs.Remove(r.path)
	}
	l.closeSegments()
	return nil
}

// closeSegments drops the Log's reference to every segment.
func (l *Log) closeSegments() {
	l.mu.Lock()
	segs := l.mu.segs
	l.mu.segs = nil
	l.mu.Unlock()
	for _, s := range segs {
		s.release()
	}
}

// Stats returns counters for metrics.
func (l *Log) Stats() Stats {
	l.mu.RLock()
	st := Stats{Segments: len(l.mu.segs)}
	for _, s := range l.mu.segs {
		st.Bytes += s.end
		st.DiskBytes += max(s.end, l.segSize)
	}
	l.mu.RUnlock()
	st.Appends = l.stats.appends.Load()
	st.Entries = l.stats.entries.Load()
	st.BytesWritten = l.stats.bytes.Load()
	st.Fsyncs = l.stats.fsyncs.Load()
	st.FsyncDuration = time.Duration(l.stats.fsyncNanos.Load())
	return st
}
