package raftlog

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/internal/failpoint"
)

// Log compaction (DESIGN.md, "The log"; FORMAT.md, "Compacted batch
// files"): the oldest segment, once every entry in it is committed and
// applied, is rewritten as a compacted batch file and dropped.
//
// The log does not know what entries mean: the caller's BatchBuilder turns
// entries into records (apply.BuildCompactedBatch). CompactOldestSegment
// runs on the caller's background goroutine, concurrently with Append:
//
//  1. Under wmu: pick the oldest live segment if it is sealed and starts
//     right after the snapshot point, and its last entry is at or below
//     upTo (the caller's applied index, so committed).
//  2. Without locks: read its entries (readers never wait), build the
//     batch, write the file under a temporary name, fsync, rename, fsync
//     the directory.
//  3. Under wmu: if the snapshot point has not moved meanwhile, move it to
//     the batch's last index (a state frame, as Compact writes) and delete
//     the segment.
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
// until step 3 completes; recovery replays the batch (idempotent) and raft
// then finds its entries already applied.

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
		first := m.first
		err := l.deleteSegments(func(_ *lane, s *segment) bool { return s.lastIndex < first })
		l.wmu.Unlock()
		return err == nil, err
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

	entries, err := l.Entries(first, last+1, 1<<62)
	if err != nil {
		return false, fmt.Errorf("raftlog: log compaction: read entries %d..%d: %w", first, last, err)
	}
	b, err := build(entries)
	if errors.Is(err, ErrSkipSegment) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("raftlog: log compaction of %d..%d: %w", first, last, err)
	}
	if b.FirstIndex != first || b.LastIndex != last {
		return false, fmt.Errorf("raftlog: log compaction: builder returned batch %d..%d for entries %d..%d",
			b.FirstIndex, b.LastIndex, first, last)
	}
	name := batchFileName(seg.hdr.seq, first)
	failpoint.Hit("raftlog/compact-before-write")
	if err := WriteCompactedBatch(l.fs, ln.dir, name, b); err != nil {
		return false, fmt.Errorf("raftlog: log compaction: %w", err)
	}
	var size int64
	if st, err := l.fs.Stat(l.fs.PathJoin(ln.dir, name)); err == nil {
		size = st.Size()
	}
	failpoint.Hit("raftlog/compact-after-rename")

	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.checkWritable(); err != nil {
		return false, err
	}
	if m.snapIndex != snap {
		// Compact or ApplySnapshot moved the snapshot point meanwhile:
		// the batch is correct but useless.
		_ = l.fs.Remove(l.fs.PathJoin(ln.dir, name))
		return false, nil
	}
	l.w.batches = append(l.w.batches, batchFileInfo{dir: ln.dir, name: name, first: first, last: last,
		bytes: size, records: len(b.Records)})
	l.publishBatchStats()
	if err := l.compactLocked(last, nil); err != nil {
		return false, err
	}
	l.stats.segmentsCompacted.Add(1)
	l.logger.Debug("raftlog: segment rewritten as a compacted batch",
		zap.String("segment", seg.name), zap.String("batch", name),
		zap.Uint64("first", first), zap.Uint64("last", last),
		zap.Int("commands", len(entries)), zap.Int("records", len(b.Records)))
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
				bytes: st.Size(), records: len(b.Records)})
		}
	}
	slices.SortFunc(l.w.batches, func(a, b batchFileInfo) int { return int64cmp(a.first, b.first) })
	l.publishBatchStats()
	return nil
}

func int64cmp(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
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
