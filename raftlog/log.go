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
// Options.SegmentSize is 0. Truncation deletes whole segments, and the
// active one is preallocated in full, so the log's disk is its live span
// rounded up to segments plus one: at 16 MiB a log the node keeps within
// about 16 MiB (node.DefaultSnapshotBytes, DefaultCatchUpBytes) occupied
// 48 MiB after a 10^6-key load (80 MiB or so when those bounds were 32
// MiB each), at 64 MiB it occupied 128-192 MiB (docs/bench/report-20261128.md,
// "Where the disk after a load goes"). Segments this size cost the put
// rows nothing measurable (docs/bench/report-20261128.md, the same section).
const DefaultSegmentSize = 16 << 20

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
	// Dirs are the log directories, one per device. With several, each
	// Append is split into one frame per directory, written and synced in
	// parallel (FORMAT.md, "Several directories"). The list must stay the
	// same, in the same order, across restarts.
	Dirs []string
	// SegmentSize is the preallocated size of a segment; 0 means
	// DefaultSegmentSize. A batch larger than a segment goes into a segment
	// of its own, which grows past this size. It applies to segments
	// created from now on: an existing segment is filled to the size it
	// was preallocated with, never written past it.
	SegmentSize int64
	// Logger receives recovery warnings; nil means zap.NewNop().
	Logger *zap.Logger
	// MinStripeBytes is the smallest Append split across several Dirs;
	// smaller ones go whole to one directory, the directories taking
	// turns. 0 means DefaultMinStripeBytes; negative splits every Append.
	MinStripeBytes int

	// WarnSyncDuration is how long an fdatasync of the log, or the roll
	// to a new segment, may take before the log warns about it ("slow
	// fdatasync", as etcd's WAL does); 0 means DefaultWarnSyncDuration.
	WarnSyncDuration time.Duration

	// tailBudget overrides the in-memory tail budget (tests).
	tailBudget int
}

// DefaultWarnSyncDuration is etcd's threshold for its "slow fdatasync"
// warning: a sync this slow holds every write of the member back, and an
// operator grepping for etcd's message finds strata's too.
const DefaultWarnSyncDuration = time.Second

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

	// Log compaction (compactlog.go).
	BatchFiles        int    // live compacted batch files
	BatchBytes        int64  // their size
	BatchCommands     uint64 // entries they stand for
	BatchRecords      uint64 // records they hold, as their writer counted
	SegmentsCompacted uint64 // segments rewritten as batch files since Open
	BatchesWritten    uint64 // batch files written since Open (segments or --log-compaction-batch runs)
	// CompactionsSkipped counts the times since Open a builder left a run
	// (or segment) uncompacted (ErrSkipSegment), for reasons of its own
	// (logcompact.ErrNotCompactable says which). It is retried on
	// the next pass, so a run that stays skipped counts once per pass.
	CompactionsSkipped uint64
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
	fs        vfs.FS
	segSize   int64
	minStripe int // Options.MinStripeBytes, resolved
	budget    int // in-memory tail budget
	logger    *zap.Logger
	warnSync  time.Duration // Options.WarnSyncDuration, resolved
	// nextSeq is the sequence number of the next segment, in any lane;
	// lanes roll concurrently during a striped Append.
	nextSeq atomic.Uint64

	// w is owned by the writer goroutine. The writer may read mem without
	// mu, since only it changes mem. During a striped Append each lane is
	// owned by the goroutine writing its part until the Append joins them.
	//
	// wmu serialises the writes (Append, Compact, ApplySnapshot, Close)
	// with the installation of a compacted batch, which runs on the log
	// compactor's goroutine (compactlog.go). It is held across writes and
	// syncs, but readers never take it.
	wmu sync.Mutex
	w   struct {
		lanes []*lane // one per directory, in Options.Dirs order
		// batches are the compacted batch files, oldest first.
		batches []batchFileInfo
		// batchLane picks the directory of the next CompactNextBatch
		// file: the directories take turns.
		batchLane int
		op        uint64 // sequence of the last write op (striped logs only)
		failed    error
		// pending is the snapshot BeginSnapshot recorded, until the log
		// restarts after it (pending.go).
		pending *raftpb.SnapshotMetadata
	}

	mu struct {
		sync.RWMutex
		mem    *memState // guarded by mu
		closed bool      // guarded by mu
	}

	stats struct {
		appends, entries, bytes, fsyncs, fsyncNanos atomic.Uint64
		fsyncHist                                   fsyncHistogram
		// Totals over w.batches, published by publishBatchStats.
		batchFiles, batchBytes, batchCommands, batchRecords   atomic.Int64
		segmentsCompacted, batchesWritten, compactionsSkipped atomic.Uint64
	}
}

// lane is one log directory and the segments in it.
type lane struct {
	dir     string
	active  *segment
	off     int64 // where the next frame goes in active
	opened  int64 // offset just past active's opening state frame
	buf     []byte
	version uint32 // format version of the segments this lane writes
	// spare delivers the spare segment file being prepared; nil if none
	// is under way.
	spare      chan spareResult
	spareCount uint64 // spares prepared so far, for unique names
	// segs are the lane's live segments, oldest first; guarded by Log.mu.
	segs []*segment
}

// maxDirs bounds Options.Dirs: a stripe's part number is 16 bits.
const maxDirs = 64

// Open opens the log in opts.Dirs, creating it if empty, and recovers it
// as FORMAT.md describes.
func Open(opts Options) (*Log, error) {
	if opts.FS == nil {
		return nil, errors.New("raftlog: Options.FS is nil")
	}
	if len(opts.Dirs) == 0 || len(opts.Dirs) > maxDirs {
		return nil, fmt.Errorf("raftlog: %d log directories given; want 1 to %d", len(opts.Dirs), maxDirs)
	}
	l := &Log{fs: opts.FS, segSize: opts.SegmentSize, logger: opts.Logger, budget: opts.tailBudget,
		minStripe: opts.MinStripeBytes, warnSync: opts.WarnSyncDuration}
	if l.warnSync <= 0 {
		l.warnSync = DefaultWarnSyncDuration
	}
	if l.minStripe == 0 {
		l.minStripe = DefaultMinStripeBytes
	}
	seen := map[string]bool{}
	for _, d := range opts.Dirs {
		if seen[d] {
			return nil, fmt.Errorf("raftlog: log directory %s given twice", d)
		}
		seen[d] = true
		v := uint32(formatVersion)
		if len(opts.Dirs) > 1 {
			v = formatVersionStriped
		}
		l.w.lanes = append(l.w.lanes, &lane{dir: d, version: v})
	}
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
	for _, ln := range l.w.lanes {
		if err := ensureDir(l.fs, ln.dir); err != nil {
			return nil, err
		}
	}
	recover := l.recover
	if l.striped() {
		recover = l.recoverStriped
	}
	err := recover()
	if err == nil {
		err = l.loadBatchFiles()
	}
	if err == nil {
		err = l.loadPendingSnapshot()
	}
	if err != nil {
		l.closeSegments()
		return nil, err
	}
	return l, nil
}

// recover replays every segment into a fresh memState (FORMAT.md,
// "Recovery") and prepares the last segment for appending.
func (l *Log) recover() error {
	ln := l.w.lanes[0]
	names, err := l.listLane(ln)
	if err != nil {
		return err
	}
	m := newMemState()
	m.budget = l.budget
	l.mu.mem = m
	if len(names) == 0 {
		l.nextSeq.Store(1)
		return l.startSegment(ln, 1, logState{cs: m.cs}, nil)
	}
	var last scanResult
	for i, name := range names {
		isLast := i == len(names)-1
		seg, err := l.openSegment(ln, name, isLast)
		if err != nil {
			return err
		}
		res, err := scanSegment(seg.f, name, isLast, func(off int64, typ byte, payload []byte) error {
			if typ == frameStripe {
				return errors.New("stripe frame in a log with one directory (written with several --log-dir?)")
			}
			_, err := replayFrame(m, seg, off, typ, payload)
			return err
		})
		if err != nil {
			return err
		}
		if res.hdr.version != formatVersion {
			return fmt.Errorf("%w: segment %s has format version %d, written by a log with several directories",
				ErrCorrupt, name, res.hdr.version)
		}
		seg.hdr, seg.end, seg.frames, seg.capacity = res.hdr, res.end, res.frames, res.size
		last = res
	}
	if m.pos.len() > 0 && m.first != m.snapIndex+1 {
		return fmt.Errorf("%w: entries %d..%d are missing (snapshot at %d, log resumes at %d)",
			ErrCorrupt, m.snapIndex+1, m.first-1, m.snapIndex, m.first)
	}
	m.first = m.snapIndex + 1
	seg := ln.segs[len(ln.segs)-1]
	if err := l.resumeLane(ln, seg, last, m.last()); err != nil {
		return err
	}
	l.nextSeq.Store(seg.hdr.seq + 1)
	return nil
}

// resumeLane makes seg, the last segment of ln as recovery scanned it
// (last), the one appends continue in, after its last good frame. A torn
// tail (bytes after that frame that are no frame) is zeroed first, so
// that the frames appended next are never followed by stale bytes that a
// later recovery would misread. lastGood is the log's last index, for the
// warning.
func (l *Log) resumeLane(ln *lane, seg *segment, last scanResult, lastGood uint64) error {
	if last.dirtyEnd > last.end {
		l.logger.Warn("raftlog: truncating torn tail of last segment",
			zap.String("file", seg.path(l.fs)),
			zap.Int64("offset", last.end),
			zap.Int64("garbage_end", last.dirtyEnd),
			zap.Uint64("last_good_index", lastGood),
			zap.String("reason", last.tornReason))
		if err := zeroRange(seg.f, last.end, last.dirtyEnd); err != nil {
			return fmt.Errorf("truncate torn tail of %s at offset %d: %w", seg.path(l.fs), last.end, err)
		}
	}
	ln.active, ln.off, ln.opened = seg, last.end, last.firstFrames
	seg.end = last.end
	return nil
}

// striped reports whether the log has several directories.
func (l *Log) striped() bool { return len(l.w.lanes) > 1 }

// listLane lists ln's segments in sequence order and deletes leftover
// temporary files: segments whose creation crashed before the rename,
// never part of the log.
func (l *Log) listLane(ln *lane) ([]string, error) {
	names, temps, err := listSegments(l.fs, ln.dir)
	if err != nil {
		return nil, err
	}
	for _, t := range temps {
		if err := l.fs.Remove(l.fs.PathJoin(ln.dir, t)); err != nil {
			return nil, fmt.Errorf("remove temporary file %s: %w", t, err)
		}
	}
	return names, nil
}

// openSegment opens segment name of ln for recovery (read-write if it is
// the lane's last) and adds it to the lane's list, which owns it from
// then on.
func (l *Log) openSegment(ln *lane, name string, last bool) (*segment, error) {
	path := l.fs.PathJoin(ln.dir, name)
	var f vfs.File
	var err error
	if last {
		f, err = l.fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	} else {
		f, err = l.fs.Open(path)
	}
	if err != nil {
		return nil, fmt.Errorf("open segment %s: %w", path, err)
	}
	seg := &segment{dir: ln.dir, name: name, f: f}
	seg.refs.Store(1)
	ln.segs = append(ln.segs, seg)
	return seg, nil
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

// replayFrame applies one verified frame to m during recovery. rewrote
// says whether it replaced entries (a batch starting at or below m's last
// index) or reset the log (segment.lastRewriteOp).
func replayFrame(m *memState, seg *segment, off int64, typ byte, payload []byte) (rewrote bool, err error) {
	switch typ {
	case frameState:
		st, err := decodeStatePayload(payload)
		if err != nil {
			return false, err
		}
		rewrote = st.reset
		m.hs = st.hs
		switch {
		case st.reset:
			m.reset(st.snapIndex, st.snapTerm, st.cs)
		case st.snapIndex > m.snapIndex || m.snapIndex == 0:
			m.compact(st.snapIndex, st.snapTerm, st.cs)
		}
	case frameBatch:
		// The entries alias payload, a buffer the scanner reuses: recovery
		// keeps their positions, not their data (memState.replayEntries).
		b, err := decodeBatchPayload(payload)
		if err != nil {
			return false, err
		}
		rewrote = len(b.entries) > 0 && b.entries[0].GetIndex() <= m.last()
		if b.hasHS {
			m.hs = b.hs
		}
		m.replayEntries(b.entries, seg, off)
		seg.frames++
		seg.entries += len(b.entries)
		if n := len(b.entries); n > 0 {
			seg.lastIndex = max(seg.lastIndex, b.entries[n-1].GetIndex())
		}
	}
	return rewrote, nil
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

// startSegment creates the next segment of lane ln, opening with state st,
// and makes it the lane's active segment. In a striped log the state
// frame is wrapped in stripe sp (which must be non-nil). It uses the spare
// file if one is being prepared (waiting for it if need be).
func (l *Log) startSegment(ln *lane, firstIndex uint64, st logState, sp *stripe) error {
	start := time.Now()
	seq := l.nextSeq.Add(1) - 1
	spare := ""
	var spareWait time.Duration
	if ln.spare != nil {
		r := <-ln.spare
		spareWait = time.Since(start)
		ln.spare = nil
		if r.err == nil {
			spare = r.path
		} else {
			// Not fatal: nothing of the log was touched. Create the
			// segment the slow way, which reports a real problem.
			l.logger.Warn("raftlog: preparing a spare segment failed", zap.Error(r.err))
			_ = l.fs.Remove(r.path)
		}
	}
	seg, err := createSegment(l.fs, ln.dir, ln.version, seq, firstIndex, l.segSize, spare, func(buf []byte, salt uint64) ([]byte, error) {
		if sp == nil {
			return appendStateFrame(buf, salt, st)
		}
		n, fill, err := statePayload(st)
		if err != nil {
			return buf, err
		}
		return appendStripeFrame(buf, salt, *sp, frameState, n, fill), nil
	})
	if err != nil {
		return err
	}
	// A roll syncs the new segment's header and the directory, and may
	// wait for its spare: all of it delays the Append that rolled.
	if took := time.Since(start); took > l.warnSync {
		l.logger.Warn("raftlog: slow segment roll", zap.String("segment", seg.path(l.fs)),
			zap.Duration("took", took), zap.Duration("spare-wait", spareWait),
			zap.Duration("expected-duration", l.warnSync))
	}
	seg.frames = 1
	if sp != nil {
		seg.firstOp = sp.op
	}
	l.mu.Lock()
	ln.segs = append(ln.segs, seg)
	l.mu.Unlock()
	ln.active, ln.off, ln.opened = seg, seg.end, seg.end
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
func (l *Log) prepareSpare(ln *lane) {
	if ln.spare != nil || l.w.failed != nil {
		return
	}
	ch := make(chan spareResult, 1)
	ln.spare = ch
	ln.spareCount++
	path := l.fs.PathJoin(ln.dir, spareName(ln.spareCount))
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
	l.wmu.Lock()
	defer l.wmu.Unlock()
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
	// A striped frame wraps the payload in a stripe header, and recovery
	// refuses a frame above MaxFrameSize as torn: the limit counts it.
	limit := MaxFrameSize
	if l.striped() {
		limit -= stripeHeaderSize
	}
	if size := batchPayloadSize(entries, withHS); size > limit {
		return fmt.Errorf("raftlog: append of %d entries is %d bytes, above the frame limit %d", len(entries), size, limit)
	}
	var h hardState
	if withHS {
		h = hardStateOf(hs)
	}
	if l.striped() {
		return l.appendStriped(entries, first, withHS, h)
	}
	ln := l.w.lanes[0]
	frameLen := int64(frameHeaderSize + padded(batchPayloadSize(entries, withHS)))
	if err := l.rollIfFull(ln, frameLen, first, nil); err != nil {
		l.w.failed = err
		return fmt.Errorf("raftlog: %w", err)
	}
	seg, off := ln.active, ln.off
	ln.buf = appendBatchFrame(ln.buf[:0], seg.hdr.salt, entries, withHS, h)
	if err := l.writeAndSync(ln, ln.buf); err != nil {
		l.w.failed = err
		return fmt.Errorf("raftlog: %w", err)
	}

	l.mu.Lock()
	l.publish(entries, seg, off)
	if withHS {
		m.hs = h
	}
	seg.end = ln.off
	l.mu.Unlock()
	l.stats.appends.Add(1)
	l.stats.entries.Add(uint64(len(entries)))
	l.prepareSpare(ln)
	return nil
}

// publish makes entries, durable in the frame at (seg, off), visible to
// readers and accounts them to seg.
// REQUIRES: l.mu held for writing.
func (l *Log) publish(entries []*raftpb.Entry, seg *segment, off int64) {
	l.mu.mem.appendEntries(entries, seg, off)
	seg.frames++
	seg.entries += len(entries)
	if n := len(entries); n > 0 {
		seg.lastIndex = max(seg.lastIndex, entries[n-1].GetIndex())
	}
}

// rollIfFull starts a new segment in ln if a frame of frameLen bytes does
// not fit in the active one's preallocated space and the active one holds
// more than its opening state. firstIndex names the new segment; sp is the
// stripe of its opening state frame (nil in a log with one directory).
func (l *Log) rollIfFull(ln *lane, frameLen int64, firstIndex uint64, sp *stripe) error {
	if ln.off+frameLen <= ln.active.capacity || ln.off <= ln.opened {
		return nil
	}
	if err := l.startSegment(ln, firstIndex, l.currentState(), sp); err != nil {
		return fmt.Errorf("roll to a new segment in %s: %w", ln.dir, err)
	}
	return nil
}

// writeAndSync writes buf at the end of ln's active segment and fdatasyncs
// it. The caller marks the log failed on error.
func (l *Log) writeAndSync(ln *lane, buf []byte) error {
	seg := ln.active
	if _, err := seg.f.WriteAt(buf, ln.off); err != nil {
		return fmt.Errorf("write %s at offset %d: %w", seg.path(l.fs), ln.off, err)
	}
	failpoint.Hit("raftlog/before-sync")
	start := time.Now()
	err := seg.f.SyncData()
	took := time.Since(start)
	l.stats.fsyncNanos.Add(uint64(took))
	l.stats.fsyncs.Add(1)
	l.stats.fsyncHist.observe(took)
	if err != nil {
		return fmt.Errorf("fdatasync %s: %w", seg.path(l.fs), err)
	}
	if took > l.warnSync {
		l.logger.Warn("slow fdatasync", zap.String("segment", seg.path(l.fs)), zap.Int("bytes", len(buf)),
			zap.Duration("took", took), zap.Duration("expected-duration", l.warnSync))
	}
	failpoint.Hit("raftlog/after-sync")
	ln.off += int64(len(buf))
	l.stats.bytes.Add(uint64(len(buf)))
	return nil
}

// Compact records that every entry <= index is held elsewhere (durably in
// the engine, docs/design.md, durability rule 4) and that raft's snapshot point is (index,
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
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.checkWritable(); err != nil {
		return err
	}
	// Compacted batches at or below index are held by the engine too.
	if err := l.dropBatchFiles(index); err != nil {
		return err
	}
	return l.compactLocked(index, cs)
}

// compactLocked is Compact without the batch files.
// REQUIRES: l.wmu held.
func (l *Log) compactLocked(index uint64, cs *raftpb.ConfState) error {
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
	// The state goes to the first lane; in a striped log it is an op of
	// one part, ordered among the Appends by its op sequence.
	ln := l.w.lanes[0]
	var sp *stripe
	n, fill, err := statePayload(st)
	if err != nil {
		return fmt.Errorf("raftlog: log compaction to %d: %w", index, err)
	}
	if l.striped() {
		l.w.op++
		sp = &stripe{op: l.w.op, part: 0, parts: 1}
		ln.buf = appendStripeFrame(ln.buf[:0], ln.active.hdr.salt, *sp, frameState, n, fill)
	} else {
		ln.buf = appendFrame(ln.buf[:0], ln.active.hdr.salt, frameState, n, fill)
	}
	if ln.off+int64(len(ln.buf)) > ln.active.capacity && ln.off > ln.opened {
		// The new segment opens with this very state.
		if err := l.startSegment(ln, m.last()+1, st, sp); err != nil {
			l.w.failed = err
			return fmt.Errorf("raftlog: log compaction to %d: %w", index, err)
		}
	} else {
		if err := l.writeAndSync(ln, ln.buf); err != nil {
			l.w.failed = err
			return fmt.Errorf("raftlog: %w", err)
		}
		l.mu.Lock()
		ln.active.frames++
		l.mu.Unlock()
	}
	l.mu.Lock()
	m.compact(index, term, cs)
	m.hs = hs
	ln.active.end = ln.off
	l.mu.Unlock()
	_, err = l.deleteSegments(func(_ *lane, s *segment) bool { return s.lastIndex <= index }, true)
	return err
}

// deleteSegments removes, in every lane, the oldest segments other than
// the active one while drop accepts them, then syncs the directories, and
// returns how many it removed. The state that makes them unnecessary is
// durable before this is called; a crash in between leaves files that the
// next recovery replays harmlessly.
//
// inOpOrder (log compaction), in a log with several lanes, also keeps
// every segment from the first one holding a rewrite (segment.
// lastRewriteOp) at or after the oldest write of any segment drop keeps.
// With one lane, deleting oldest first does that by itself. Without it, an
// Append that replaced a suffix (a new leader overwriting uncommitted
// entries) could be deleted from one lane while the entries it replaced
// stay in another, and replay would bring them back after the snapshot
// point (TestStripedCompactionKeepsOverwrite); a deleted reset would let
// the entries before it back. A write that only extends the log can go:
// the entries it holds are below the snapshot point, and a kept write
// older than it holds none it replaced. ApplySnapshot passes false: its
// reset makes every earlier write irrelevant to replay, and the reset's
// own segment is kept.
func (l *Log) deleteSegments(drop func(*lane, *segment) bool, inOpOrder bool) (int, error) {
	doomed := make([][]*segment, len(l.w.lanes))
	l.mu.Lock()
	dropped := make([]int, len(l.w.lanes)) // per lane, the prefix drop accepts
	oldestKept := ^uint64(0)               // the lowest firstOp of a segment drop keeps
	for i, ln := range l.w.lanes {
		n := 0
		for n < len(ln.segs)-1 && ln.segs[n] != ln.active && drop(ln, ln.segs[n]) {
			n++
		}
		dropped[i] = n
		if n < len(ln.segs) { // always: the active segment is kept
			oldestKept = min(oldestKept, ln.segs[n].firstOp)
		}
	}
	for i, ln := range l.w.lanes {
		n := dropped[i]
		if inOpOrder && l.striped() {
			n = 0
			for n < dropped[i] && ln.segs[n].lastRewriteOp < oldestKept {
				n++
			}
		}
		doomed[i] = append([]*segment(nil), ln.segs[:n]...)
		ln.segs = shrink(ln.segs, n)
	}
	l.mu.Unlock()
	var errs []error
	removed := 0
	for i, ln := range l.w.lanes {
		if len(doomed[i]) == 0 {
			continue
		}
		for _, s := range doomed[i] {
			if err := l.fs.Remove(s.path(l.fs)); err != nil {
				errs = append(errs, fmt.Errorf("remove segment %s: %w", s.path(l.fs), err))
			}
			s.release() // readers still holding it keep the file open
		}
		removed += len(doomed[i])
		if err := syncDir(l.fs, ln.dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("raftlog: delete compacted segments: %w", err)
	}
	return removed, nil
}

// ApplySnapshot discards the whole log and restarts it after meta's index:
// a follower installed a snapshot. It creates a new segment opening with a
// reset state frame, then deletes every older segment and every compacted
// batch file. The HardState's commit index is raised to the snapshot index
// if below it. It returns raft.ErrSnapOutOfDate if meta is not newer than
// the snapshot point.
func (l *Log) ApplySnapshot(meta *raftpb.SnapshotMetadata) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
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
	ln := l.w.lanes[0]
	old := ln.active
	var sp *stripe
	if l.striped() {
		l.w.op++
		sp = &stripe{op: l.w.op, part: 0, parts: 1}
	}
	if err := l.startSegment(ln, index+1, st, sp); err != nil {
		l.w.failed = err
		return fmt.Errorf("raftlog: apply snapshot at %d: %w", index, err)
	}
	l.mu.Lock()
	if sp != nil {
		ln.active.lastRewriteOp = sp.op
	}
	m.reset(index, term, cs)
	m.hs = hs
	l.mu.Unlock()
	// Every frame of the other lanes precedes the reset in op order, so
	// all their segments but the active ones may go.
	_, err := l.deleteSegments(func(x *lane, s *segment) bool { return x != ln || s.hdr.seq <= old.hdr.seq }, false)
	// The batch files stand for entries of the history the reset
	// replaced (all end at or below the old snapshot point, below index).
	if berr := l.dropBatchFiles(index); err == nil {
		err = berr
	}
	return err
}

// Close closes the log. Reads and writes after Close return ErrClosed.
// Everything Append returned for is already durable; Close syncs nothing.
func (l *Log) Close() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	if l.mu.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	l.mu.closed = true
	l.mu.Unlock()
	for _, ln := range l.w.lanes {
		if ln.spare != nil {
			// Wait for the preparing goroutine; Open would delete the file.
			r := <-ln.spare
			ln.spare = nil
			_ = l.fs.Remove(r.path)
		}
	}
	l.closeSegments()
	return nil
}

// closeSegments drops the Log's reference to every segment.
func (l *Log) closeSegments() {
	l.mu.Lock()
	var segs []*segment
	for _, ln := range l.w.lanes {
		segs = append(segs, ln.segs...)
		ln.segs = nil
	}
	l.mu.Unlock()
	for _, s := range segs {
		s.release()
	}
}

// Stats returns counters for metrics.
func (l *Log) Stats() Stats {
	l.mu.RLock()
	var st Stats
	for _, ln := range l.w.lanes {
		st.Segments += len(ln.segs)
		for _, s := range ln.segs {
			st.Bytes += s.end
			st.DiskBytes += max(s.end, s.capacity)
		}
	}
	l.mu.RUnlock()
	st.Appends = l.stats.appends.Load()
	st.Entries = l.stats.entries.Load()
	st.BytesWritten = l.stats.bytes.Load()
	st.Fsyncs = l.stats.fsyncs.Load()
	st.FsyncDuration = time.Duration(l.stats.fsyncNanos.Load())
	st.BatchFiles = int(l.stats.batchFiles.Load())
	st.BatchBytes = l.stats.batchBytes.Load()
	st.BatchCommands = uint64(l.stats.batchCommands.Load())
	st.BatchRecords = uint64(l.stats.batchRecords.Load())
	st.SegmentsCompacted = l.stats.segmentsCompacted.Load()
	st.BatchesWritten = l.stats.batchesWritten.Load()
	st.CompactionsSkipped = l.stats.compactionsSkipped.Load()
	return st
}
