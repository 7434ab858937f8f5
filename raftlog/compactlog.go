package raftlog

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/internal/failpoint"
)

// Log compaction (docs/design.md, "The log format"; FORMAT.md, "Compacted batch
// files"): a run of committed and applied entries right after the
// snapshot point is rewritten as a compacted batch file, and the snapshot
// point moves past it. The run is either the oldest segment
// (CompactOldestSegment) or the next n entries (CompactNextBatch,
// --log-compaction-batch).
//
// The log does not know what entries mean: the caller's BatchBuilder turns
// entries into a payload (logcompact's builder), which the log stores
// without reading it. Both run on the
// caller's background goroutine, concurrently with Append:
//
//  1. Under wmu: pick the run: the oldest live segment if it is sealed and
//     starts right after the snapshot point, or the next n entries; its
//     last entry must be at or below upTo (the caller's applied index, so
//     committed).
//  2. Without locks: read its entries (readers never wait), build the
//     batch, write the file under a temporary name, fsync, rename, fsync
//     the directory.
//  3. Under wmu: if the snapshot point has not moved meanwhile, move it to
//     the batch's last index (a state frame, as Compact writes) and delete
//     every segment whose entries are all at or below it.
//
// Raft's view: the batch's entries are below the snapshot point from then
// on (FirstIndex moves past them; Term of the batch's last index is the
// snapshot term), exactly as after Compact. They are not lost: recovery
// replays the batch files after the engine's applied index before raft
// starts (CompactedBatches), so the engine reaches the snapshot point. A
// follower that needs them gets a snapshot. Batch files are deleted by
// Compact once the engine holds them durably.
//
// Crashes: before the rename, the temporary file is deleted by Open and
// the segment is intact. After it, the batch and the segment both exist
// until the state frame of step 3 is durable; without it the batch ends
// above the recovered snapshot point, its entries are all still in the
// segments, and Open deletes it (so batch files are always consecutive,
// the newest ending at the snapshot point).

// batchFileInfo is what the log keeps about one compacted batch file.
type batchFileInfo struct {
	dir, name   string
	first, last uint64
	bytes       int64
	records     int
}

// publishBatchStats recomputes the batch file totals Stats reports.
// REQUIRES: l.wmu held (or Open).
func (l *Log) publishBatchStats() {
	var bytes, commands, records int64
	for _, b := range l.w.batches {
		bytes += b.bytes
		commands += int64(b.last - b.first + 1)
		records += int64(b.records)
	}
	l.stats.batchFiles.Store(int64(len(l.w.batches)))
	l.stats.batchBytes.Store(bytes)
	l.stats.batchCommands.Store(commands)
	l.stats.batchRecords.Store(records)
}

// BatchBuilder builds the compacted batch for consecutive, committed and
// applied entries. It may return an error wrapping ErrNotCompactable (for
// example, entries that change the configuration): the segment is then
// left as it is.
type BatchBuilder func(entries []*raftpb.Entry) (*CompactedBatch, error)

// ErrSkipSegment may be wrapped by a BatchBuilder's error to leave a
// segment uncompacted without failing.
var ErrSkipSegment = errors.New("raftlog: segment left uncompacted")

// CompactOldestSegment rewrites the oldest segment as a compacted batch
// file if every entry in it is at or below upTo (see the steps above). It
// reports whether it did.
//
// With several directories a segment holds parts of many writes, so the
// unit is an index range: among the directories whose oldest segment is
// sealed, the one whose oldest segment ends lowest gives the range's end
// L; the batch stands for (snapshot point, L] and goes to that directory,
// and moving the snapshot point to L deletes that segment (and any other
// ending at or below L). With one directory this is the oldest segment.
func (l *Log) CompactOldestSegment(upTo uint64, build BatchBuilder) (bool, error) {
	l.wmu.Lock()
	if err := l.checkWritable(); err != nil {
		l.wmu.Unlock()
		return false, err
	}
	m := l.mu.mem
	var seg *segment
	var ln *lane
	dead := false
	l.mu.RLock()
	for _, x := range l.w.lanes {
		if len(x.segs) < 2 || x.segs[0] == x.active {
			continue
		}
		if x.segs[0].lastIndex < m.first {
			dead = true // nothing live in it (only state frames, or compacted entries)
		} else if seg == nil || x.segs[0].lastIndex < seg.lastIndex {
			seg, ln = x.segs[0], x
		}
	}
	l.mu.RUnlock()
	if dead {
		// A dead segment may have to wait for older writes in other lanes
		// (deleteSegments, in op order); compaction goes on meanwhile.
		first := m.first
		removed, err := l.deleteSegments(func(_ *lane, s *segment) bool { return s.lastIndex < first }, true)
		if err != nil || removed > 0 {
			l.wmu.Unlock()
			return err == nil, err
		}
	}
	l.mu.RLock()
	first, snap := m.first, m.snapIndex
	var last uint64
	if seg != nil {
		last = seg.lastIndex
	}
	l.mu.RUnlock()
	l.wmu.Unlock()
	if seg == nil || last < first || last > upTo {
		return false, nil
	}
	ok, err := l.compactRange(first, last, snap, ln.dir, batchFileName(seg.hdr.seq, first), build)
	if ok {
		l.stats.segmentsCompacted.Add(1)
		l.logger.Debug("raftlog: segment rewritten as a compacted batch", zap.String("segment", seg.name))
	}
	return ok, err
}

// CompactNextBatch rewrites the n entries right after the snapshot point,
// (snapshot point, snapshot point + n], as a compacted batch file once
// every one of them is at or below upTo (the caller's applied index), and
// moves the snapshot point to the batch's last index, as
// CompactOldestSegment does for a segment. It reports whether it did; it
// does nothing while fewer than n entries after the snapshot point are
// applied. This is --log-compaction-batch: 000's batches of a fixed number
// of commands.
//
// Segments are untouched by the batch itself: a segment is deleted (by
// the state frame's compaction, as after Compact) once every entry in it
// is at or below the snapshot point, so one segment stands for many
// batches and no segment is rolled, let alone zero-filled, per batch.
// Recovery replays a segment's entries below the snapshot point and then
// drops them at the state frame that moved it (memState.compact); raft
// never sees them. Batch files go to the directories in turn, so with
// several directories consecutive batches are written to different
// devices (000's parallel log writers).
func (l *Log) CompactNextBatch(upTo, n uint64, build BatchBuilder) (bool, error) {
	if n == 0 {
		return false, errors.New("raftlog: log compaction batch of 0 entries")
	}
	l.wmu.Lock()
	if err := l.checkWritable(); err != nil {
		l.wmu.Unlock()
		return false, err
	}
	m := l.mu.mem
	l.mu.RLock()
	first, snap, lastIndex := m.first, m.snapIndex, m.last()
	var seq uint64
	if m.pos.len() > 0 {
		seq = m.pos.at(0).seg.hdr.seq
	}
	l.mu.RUnlock()
	ln := l.w.lanes[l.w.batchLane%len(l.w.lanes)]
	l.wmu.Unlock()
	last := snap + n
	if last > upTo || last > lastIndex {
		return false, nil
	}
	ok, err := l.compactRange(first, last, snap, ln.dir, batchFileName(seq, first), build)
	if ok {
		l.wmu.Lock()
		l.w.batchLane++
		l.wmu.Unlock()
	}
	return ok, err
}

// compactRange turns the entries [first, last], the first ones after the
// snapshot point snap, into the batch file name in dir and moves the
// snapshot point to last (steps 2 and 3 of the comment above). It does
// nothing and reports false if the builder skips the range or the
// snapshot point moved meanwhile.
func (l *Log) compactRange(first, last, snap uint64, dir, name string, build BatchBuilder) (bool, error) {
	entries, err := l.Entries(first, last+1, 1<<62)
	if errors.Is(err, raft.ErrCompacted) {
		return false, nil // Compact or ApplySnapshot moved the snapshot point past first
	}
	if err != nil {
		return false, fmt.Errorf("raftlog: log compaction: read entries %d..%d: %w", first, last, err)
	}
	b, err := build(entries)
	if errors.Is(err, ErrSkipSegment) {
		l.stats.compactionsSkipped.Add(1)
		l.logger.Debug("raftlog: entries left uncompacted", zap.Uint64("first", first), zap.Uint64("last", last), zap.Error(err))
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("raftlog: log compaction of %d..%d: %w", first, last, err)
	}
	if b.FirstIndex != first || b.LastIndex != last {
		return false, fmt.Errorf("raftlog: log compaction: builder returned batch %d..%d for entries %d..%d",
			b.FirstIndex, b.LastIndex, first, last)
	}
	failpoint.Hit("raftlog/compact-before-write")
	if err := WriteCompactedBatch(l.fs, dir, name, b); err != nil {
		return false, fmt.Errorf("raftlog: log compaction: %w", err)
	}
	var size int64
	if st, err := l.fs.Stat(l.fs.PathJoin(dir, name)); err == nil {
		size = st.Size()
	}
	failpoint.Hit("raftlog/compact-after-rename")

	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.checkWritable(); err != nil {
		return false, err
	}
	if l.mu.mem.snapIndex != snap {
		// Compact or ApplySnapshot moved the snapshot point meanwhile:
		// the batch is correct but useless.
		_ = l.fs.Remove(l.fs.PathJoin(dir, name))
		return false, nil
	}
	l.w.batches = append(l.w.batches, batchFileInfo{dir: dir, name: name, first: first, last: last,
		bytes: size, records: int(b.Records)})
	l.publishBatchStats()
	if err := l.compactLocked(last, nil); err != nil {
		return false, err
	}
	l.stats.batchesWritten.Add(1)
	l.logger.Debug("raftlog: entries rewritten as a compacted batch",
		zap.String("batch", name), zap.Uint64("first", first), zap.Uint64("last", last),
		zap.Int("commands", len(entries)), zap.Uint64("records", b.Records))
	return true, nil
}

// CompactedBatches reads the compacted batch files whose last index is
// above after, oldest first: what recovery replays on an engine that
// applied up to after, before raft starts.
func (l *Log) CompactedBatches(after uint64) ([]*CompactedBatch, error) {
	l.wmu.Lock()
	infos := slices.Clone(l.w.batches)
	l.wmu.Unlock()
	var out []*CompactedBatch
	for _, bi := range infos {
		if bi.last <= after {
			continue
		}
		b, err := ReadCompactedBatch(l.fs, l.fs.PathJoin(bi.dir, bi.name))
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// loadBatchFiles finds the compacted batch files at Open, deleting the
// temporary ones of a crashed compaction.
func (l *Log) loadBatchFiles() error {
	for _, ln := range l.w.lanes {
		names, err := l.fs.List(ln.dir)
		if err != nil {
			return fmt.Errorf("list log dir %s: %w", ln.dir, err)
		}
		slices.Sort(names)
		for _, name := range names {
			if strings.HasSuffix(name, batchFileSuffix+tempSuffix) {
				if err := l.fs.Remove(l.fs.PathJoin(ln.dir, name)); err != nil {
					return fmt.Errorf("remove temporary file %s: %w", name, err)
				}
				continue
			}
			if _, _, ok := parseBatchFileName(name); !ok {
				continue
			}
			path := l.fs.PathJoin(ln.dir, name)
			b, err := ReadCompactedBatch(l.fs, path)
			if err != nil {
				return err
			}
			st, err := l.fs.Stat(path)
			if err != nil {
				return fmt.Errorf("stat %s: %w", path, err)
			}
			l.w.batches = append(l.w.batches, batchFileInfo{dir: ln.dir, name: name, first: b.FirstIndex, last: b.LastIndex,
				bytes: st.Size(), records: int(b.Records)})
		}
	}
	slices.SortFunc(l.w.batches, func(a, b batchFileInfo) int { return cmp.Compare(a.first, b.first) })
	// A batch ending above the snapshot point is the leftover of a log
	// compaction that crashed before its state frame was durable: its
	// entries above the snapshot point are all still in the segments
	// (segments are deleted only below it), the ones below are in other
	// batches or the engine. It would overlap the next batch: delete it.
	snap := l.mu.mem.snapIndex
	kept := l.w.batches[:0]
	dirs := map[string]bool{}
	for _, b := range l.w.batches {
		if b.last <= snap {
			kept = append(kept, b)
			continue
		}
		l.logger.Info("raftlog: deleting a compacted batch left by an interrupted log compaction",
			zap.String("batch", b.name), zap.Uint64("last", b.last), zap.Uint64("snapshot", snap))
		if err := l.fs.Remove(l.fs.PathJoin(b.dir, b.name)); err != nil {
			return fmt.Errorf("remove leftover compacted batch %s: %w", b.name, err)
		}
		dirs[b.dir] = true
	}
	l.w.batches = kept
	for d := range dirs {
		if err := syncDir(l.fs, d); err != nil {
			return err
		}
	}
	l.publishBatchStats()
	return nil
}

// dropBatchFiles deletes the compacted batch files whose entries are all
// at or below index (held durably by the engine).
// REQUIRES: l.wmu held.
func (l *Log) dropBatchFiles(index uint64) error {
	n := 0
	dirs := map[string]bool{}
	var errs []error
	for n < len(l.w.batches) && l.w.batches[n].last <= index {
		bi := l.w.batches[n]
		if err := l.fs.Remove(l.fs.PathJoin(bi.dir, bi.name)); err != nil {
			errs = append(errs, fmt.Errorf("remove compacted batch %s: %w", bi.name, err))
		}
		dirs[bi.dir] = true
		n++
	}
	l.w.batches = l.w.batches[n:]
	l.publishBatchStats()
	for d := range dirs {
		if err := syncDir(l.fs, d); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	return nil
}

// CompactedRange returns the index range the compacted batch files stand
// for, [first, last], and how many files there are; n is 0 when there is
// none. The files are consecutive (the newest ends at the snapshot point).
func (l *Log) CompactedRange() (first, last uint64, n int) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if len(l.w.batches) == 0 {
		return 0, 0, 0
	}
	return l.w.batches[0].first, l.w.batches[len(l.w.batches)-1].last, len(l.w.batches)
}

// CompactedBatchAt reads the compacted batch file that stands for index;
// nil if no file does (index is not compacted, or was truncated).
func (l *Log) CompactedBatchAt(index uint64) (*CompactedBatch, error) {
	l.wmu.Lock()
	var found *batchFileInfo
	for i := range l.w.batches {
		if bi := l.w.batches[i]; bi.first <= index && index <= bi.last {
			found = &bi
			break
		}
	}
	l.wmu.Unlock()
	if found == nil {
		return nil, nil
	}
	b, err := ReadCompactedBatch(l.fs, l.fs.PathJoin(found.dir, found.name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // truncated meanwhile
	}
	return b, err
}
