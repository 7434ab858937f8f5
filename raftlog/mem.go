package raftlog

import (
	"go.etcd.io/raft/v3/raftpb"
)

// tailBudget bounds the entry data kept in memory for raft's reads. Older
// entries are read back from their segment through the position index.
//
// Why 2 MiB: raft reads an entry from the tail to apply it and to send it
// to a follower, both soon after its append; one Ready's entries are at
// most a few hundred KiB even at 1,000 clients. The same bytes also sit in
// the engine's memtable until it flushes, so a larger tail held the data
// twice: at 8 MiB it was two fifths of the live heap after a small load, and
// 2 MiB lowered the peak memory of a 10^4-key LIST by 4-12 MiB with puts
// (one and three members) and a 10^6-key load unchanged
// (docs/bench/performance.md, "The raft log's in-memory tail").
const tailBudget = 2 << 20

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
//  1. pos.at(k) is the position of entry first+k; first == snapIndex+1.
//  2. tail holds entries last()-len(tail)+1 .. last(), consecutive.
//  3. tailBytes is the accounted size of tail and stays <= budget,
//     except that the newest batch is always kept whole.
type memState struct {
	snapIndex, snapTerm uint64
	cs                  *raftpb.ConfState
	hs                  hardState

	first     uint64
	pos       posList
	tail      []*raftpb.Entry
	tailBytes int
	budget    int // tailBudget; tests lower it
}

func newMemState() *memState {
	return &memState{first: 1, cs: &raftpb.ConfState{}, budget: tailBudget}
}

// last is the index of the last entry (snapIndex if there is none).
func (m *memState) last() uint64 { return m.first + uint64(m.pos.len()) - 1 }

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
		m.pos.truncate(0)
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
		m.pos.truncate(int(i - m.first))
	}
	for _, e := range entries {
		m.pos.push(entryPos{term: e.GetTerm(), seg: seg, off: off})
		m.tail = append(m.tail, e)
		m.tailBytes += entryCost(e)
	}
	m.evictTail(len(entries))
}

// replayEntries is appendEntries for recovery: it records the entries'
// positions and keeps none of them in memory, so the tail is empty after
// Open and refills with the entries appended from then on. Keeping the
// newest entries whole would mean copying every frame's data out of the
// scanner's buffer, since which entries end up newest is known only at the
// end: at 10^6 keys, 64 MiB of segments copied for an 8 MiB tail took most
// of the log's open (docs/bench/performance.md, "Start-up replay in
// pieces"). Raft's first reads after a restart come from the segments.
func (m *memState) replayEntries(entries []*raftpb.Entry, seg *segment, off int64) {
	m.appendEntries(entries, seg, off)
	clear(m.tail) // entries alias the scanner's buffer: not to be read
	m.tail, m.tailBytes = m.tail[:0], 0
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
		m.pos.truncate(0)
		m.first, m.tail, m.tailBytes = index+1, nil, 0
		return
	}
	if tf := m.tailFirst(); index >= tf {
		for _, e := range m.tail[:index-tf+1] {
			m.tailBytes -= entryCost(e)
		}
		m.tail = shrink(m.tail, int(index-tf+1))
	}
	m.pos.dropFront(int(index - m.first + 1))
	m.first = index + 1
}

// reset discards every entry and restarts the log after index (a snapshot
// was installed).
func (m *memState) reset(index, term uint64, cs *raftpb.ConfState) {
	m.snapIndex, m.snapTerm, m.cs = index, term, cs
	m.pos.truncate(0)
	m.first, m.tail, m.tailBytes = index+1, nil, 0
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

// posChunk is the number of positions per chunk of a posList.
const posChunk = 4096

// posList is a list of entry positions stored in fixed-size chunks, so that
// growing it never copies (a plain slice of a million positions would copy
// 24 MB while holding the lock) and dropping a prefix frees whole chunks.
type posList struct {
	chunks [][]entryPos // every chunk but the last is full
	skip   int          // positions dropped from the front of chunks[0]
}

func (p *posList) len() int {
	if len(p.chunks) == 0 {
		return 0
	}
	return (len(p.chunks)-1)*posChunk + len(p.chunks[len(p.chunks)-1]) - p.skip
}

func (p *posList) at(k int) entryPos {
	k += p.skip
	return p.chunks[k/posChunk][k%posChunk]
}

func (p *posList) push(e entryPos) {
	if n := len(p.chunks); n == 0 || len(p.chunks[n-1]) == posChunk {
		p.chunks = append(p.chunks, make([]entryPos, 0, posChunk))
	}
	last := &p.chunks[len(p.chunks)-1]
	*last = append(*last, e)
}

// truncate keeps the first k positions.
func (p *posList) truncate(k int) {
	if k == 0 {
		clear(p.chunks)
		p.chunks, p.skip = p.chunks[:0], 0
		return
	}
	total := p.skip + k
	n := (total + posChunk - 1) / posChunk
	clear(p.chunks[n:])
	p.chunks = p.chunks[:n]
	last := p.chunks[n-1]
	keep := total - (n-1)*posChunk
	clear(last[keep:]) // drop segment references for the collector
	p.chunks[n-1] = last[:keep]
}

// dropFront removes the first k positions.
func (p *posList) dropFront(k int) {
	if k >= p.len() {
		p.truncate(0)
		return
	}
	p.skip += k
	n := p.skip / posChunk
	if n > 0 {
		clear(p.chunks[:n])
		p.chunks = shrink(p.chunks, n)
		p.skip -= n * posChunk
	}
}
