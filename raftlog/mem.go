package raftlog

import (
	"go.etcd.io/raft/v3/raftpb"
)

// tailBudget bounds the entry data kept in memory for raft's reads. Older
// entries are read back from their segment through the position index.
const tailBudget = 8 << 20

// tailEntryOverhead is what an in-memory entry costs besides its data.
const tailEntryOverhead = 64

// entryPos locates an entry on disk: the batch frame that holds it. It also
// keeps the term, which raft asks for far more often than for the entry.
type entryPos struct {
	term uint64
	seg  *segment
	off  int64
}

// memState is the log as seen by readers: the snapshot point, the
// HardState, the position of every entry after the snapshot point and the
// most recent entries themselves. It does no I/O, so that replay at Open and
// Append share the same index arithmetic.
//
// Invariants (after Open; replay may hold a gap until its final check):
//  1. pos[k] is the position of entry first+k; first == snapIndex+1.
//  2. tail holds entries last()-len(tail)+1 .. last(), consecutive.
//  3. tailBytes is the accounted size of tail and stays <= budget,
//     except that the newest batch is always kept whole.
type memState struct {
	snapIndex, snapTerm uint64
	cs                  *raftpb.ConfState
	hs                  hardState

	first     uint64
	pos       []entryPos
	tail      []*raftpb.Entry
	tailBytes int
	budget    int // tailBudget; tests lower it
}

func newMemState() *memState {
	return &memState{first: 1, cs: &raftpb.ConfState{}, budget: tailBudget}
}

// last is the index of the last entry (snapIndex if there is none).
func (m *memState) last() uint64 { return m.first + uint64(len(m.pos)) - 1 }

// tailFirst is the index of the first entry held in memory.
func (m *memState) tailFirst() uint64 { return m.last() - uint64(len(m.tail)) + 1 }

func entryCost(e *raftpb.Entry) int { return len(e.GetData()) + tailEntryOverhead }

// appendEntries records consecutive entries written in the frame at (seg,
// off). An entry at or below last() replaces the suffix from its index (raft
// conflict resolution); an entry beyond last()+1 or below first starts the
// list afresh (only replay meets that: older segments were deleted by log
// compaction, and the final check verifies the snapshot covers the gap).
func (m *memState) appendEntries(entries []*raftpb.Entry, seg *segment, off int64) {
	if len(entries) == 0 {
		return
	}
	i := entries[0].GetIndex()
	if i < m.first || i > m.last()+1 {
		m.first = i
		m.pos = m.pos[:0]
		m.tail, m.tailBytes = nil, 0
	} else {
		if tf := m.tailFirst(); i < tf {
			m.tail, m.tailBytes = nil, 0
		} else {
			for _, e := range m.tail[i-tf:] {
				m.tailBytes -= entryCost(e)
			}
			clear(m.tail[i-tf:]) // drop references for the collector
			m.tail = m.tail[:i-tf]
		}
		m.pos = m.pos[:i-m.first]
	}
	for _, e := range entries {
		m.pos = append(m.pos, entryPos{term: e.GetTerm(), seg: seg, off: off})
		m.tail = append(m.tail, e)
		m.tailBytes += entryCost(e)
	}
	m.evictTail(len(entries))
}

// evictTail drops the oldest in-memory entries until the tail fits its
// budget, keeping at least keep entries.
func (m *memState) evictTail(keep int) {
	n := 0
	for m.tailBytes > m.budget && len(m.tail)-n > keep {
		m.tailBytes -= entryCost(m.tail[n])
		n++
	}
	m.tail = shrink(m.tail, n)
}

// compact records the snapshot point (index, term, cs) and drops what lies
// at or below it.
func (m *memState) compact(index, term uint64, cs *raftpb.ConfState) {
	m.snapIndex, m.snapTerm, m.cs = index, term, cs
	if index < m.first {
		return
	}
	if index > m.last() {
		m.first, m.pos, m.tail, m.tailBytes = index+1, nil, nil, 0
		return
	}
	if tf := m.tailFirst(); index >= tf {
		for _, e := range m.tail[:index-tf+1] {
			m.tailBytes -= entryCost(e)
		}
		m.tail = shrink(m.tail, int(index-tf+1))
	}
	m.pos = shrink(m.pos, int(index-m.first+1))
	m.first = index + 1
}

// reset discards every entry and restarts the log after index (a snapshot
// was installed).
func (m *memState) reset(index, term uint64, cs *raftpb.ConfState) {
	m.snapIndex, m.snapTerm, m.cs = index, term, cs
	m.first, m.pos, m.tail, m.tailBytes = index+1, nil, nil, 0
}

// shrink drops the first n elements of s. When the dropped part is larger
// than the live part it copies the live part to a new array, so that the
// dropped front does not stay pinned; smaller fronts are released when the
// next append outgrows the array.
func shrink[T any](s []T, n int) []T {
	if n == 0 {
		return s
	}
	rest := s[n:]
	if n >= len(rest) {
		return append(make([]T, 0, len(rest)+len(rest)/4+8), rest...)
	}
	clear(s[:n])
	return rest
}
