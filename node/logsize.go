package node

import "go.etcd.io/raft/v3/raftpb"

// logMarkBytes is the granularity of logSize: one mark per this many bytes
// of appended entries. The truncation schedule it serves counts in tens of
// MiB, so an error of one mark is noise, and the marks cost 16 bytes per
// MiB of log.
const logMarkBytes = 1 << 20

// logSize keeps, approximately, how many bytes of entries the log holds
// between two indexes, for the byte bounds of log truncation
// (Config.SnapshotBytes, Config.CatchUpBytes; truncate.go).
//
// It counts what this process appended: entries in the log when the node
// started, and those a snapshot install replaced, count as zero bytes. So
// after a restart the byte bounds see only new appends, and the entry
// counts (SnapshotCount, CatchUpEntries) bound the rest, as they always
// do.
//
// Invariants:
//
//  1. marks ascend in index and in bytes.
//  2. A mark {i, b} means b bytes were appended (since the count began) up
//     to and including index i. Entries rewritten by a new leader drop the
//     marks at and after their first index, and the count resumes from the
//     last mark left.
//
// REQUIRES: the node goroutine (no locking).
type logSize struct {
	marks []logMark
	total uint64 // bytes appended through the last appended index
}

// logMark says that bytes were appended up to and including index.
type logMark struct {
	index, bytes uint64
}

// appended counts entries just written to the log.
func (s *logSize) appended(ents []*raftpb.Entry) {
	if len(ents) == 0 {
		return
	}
	if first := ents[0].GetIndex(); len(s.marks) > 0 && s.marks[len(s.marks)-1].index >= first {
		// A rewrite of the tail (invariant 2).
		for len(s.marks) > 0 && s.marks[len(s.marks)-1].index >= first {
			s.marks = s.marks[:len(s.marks)-1]
		}
		s.total = 0
		if len(s.marks) > 0 {
			s.total = s.marks[len(s.marks)-1].bytes
		}
	}
	for _, e := range ents {
		s.total += uint64(len(e.GetData())) + entryOverhead
	}
	if len(s.marks) == 0 || s.total-s.marks[len(s.marks)-1].bytes >= logMarkBytes {
		s.marks = append(s.marks, logMark{index: ents[len(ents)-1].GetIndex(), bytes: s.total})
	}
}

// entryOverhead stands for an entry's index, term and type in the log's
// framing, so that entries without data still count.
const entryOverhead = 24

// bytesAt returns the bytes appended up to index, to a mark's precision:
// the count at the last mark at or below index (0 if none).
func (s *logSize) bytesAt(index uint64) uint64 {
	i := s.markAtOrBelow(index)
	if i < 0 {
		return 0
	}
	return s.marks[i].bytes
}

// between returns, to a mark's precision, the bytes appended after index
// from up to and including index to.
func (s *logSize) between(from, to uint64) uint64 {
	a, b := s.bytesAt(from), s.bytesAt(to)
	if b < a {
		return 0
	}
	return b - a
}

// keepBelow returns the highest index at or below durable that keeps at
// least margin bytes of entries between it and durable (to a mark's
// precision), and false if the log this process appended holds fewer.
func (s *logSize) keepBelow(durable, margin uint64) (uint64, bool) {
	top := s.bytesAt(durable)
	for i := s.markAtOrBelow(durable); i >= 0; i-- {
		if top-s.marks[i].bytes >= margin {
			return s.marks[i].index, true
		}
	}
	return 0, false
}

// forget drops the marks no later question needs once the log starts
// after index: all below the last one at or below index, which bytesAt of
// the truncation point still reads.
func (s *logSize) forget(index uint64) {
	if i := s.markAtOrBelow(index); i > 0 {
		s.marks = append(s.marks[:0], s.marks[i:]...)
	}
}

// reset forgets every mark: the log restarts after a snapshot.
func (s *logSize) reset() {
	s.marks = s.marks[:0]
	s.total = 0
}

// markAtOrBelow returns the position of the last mark whose index is at or
// below index, -1 if none.
func (s *logSize) markAtOrBelow(index uint64) int {
	lo, hi := 0, len(s.marks) // the answer is lo-1 once lo == hi
	for lo < hi {
		mid := (lo + hi) / 2
		if s.marks[mid].index <= index {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo - 1
}
