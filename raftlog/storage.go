package raftlog

import (
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

var _ raft.Storage = (*Log)(nil)

// InitialState returns the saved HardState and the ConfState of the
// snapshot point. Both are copies owned by the caller.
func (l *Log) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.mu.closed {
		return nil, nil, ErrClosed
	}
	m := l.mu.mem
	return m.hs.proto(), proto.CloneOf(m.cs), nil
}

// FirstIndex returns the index of the first entry available (the snapshot
// point plus one).
func (l *Log) FirstIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.mu.closed {
		return 0, ErrClosed
	}
	return l.mu.mem.first, nil
}

// LastIndex returns the index of the last durable entry, or the snapshot
// point if there is none.
func (l *Log) LastIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.mu.closed {
		return 0, ErrClosed
	}
	return l.mu.mem.last(), nil
}

// Term returns the term of entry i, for i in [FirstIndex()-1, LastIndex()]:
// raft.ErrCompacted below that range, raft.ErrUnavailable above it. Terms
// are kept in memory for every entry, so Term never reads the disk.
func (l *Log) Term(i uint64) (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.mu.closed {
		return 0, ErrClosed
	}
	m := l.mu.mem
	switch {
	case i < m.snapIndex:
		return 0, raft.ErrCompacted
	case i == m.snapIndex:
		return m.snapTerm, nil
	case i > m.last():
		return 0, raft.ErrUnavailable
	}
	return m.pos.at(int(i - m.first)).term, nil
}

// Snapshot returns the metadata of the snapshot point; Data is empty (the
// snapshot itself is an engine checkpoint, built elsewhere).
func (l *Log) Snapshot() (*raftpb.Snapshot, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.mu.closed {
		return nil, ErrClosed
	}
	m := l.mu.mem
	return &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
		Index:     proto.Uint64(m.snapIndex),
		Term:      proto.Uint64(m.snapTerm),
		ConfState: proto.CloneOf(m.cs),
	}}, nil
}

// frameRef is a batch frame and the entries [from, to) a read takes from
// it. A frame may hold more entries than that: later ones may have been
// replaced by a conflicting append, which the position index knows.
type frameRef struct {
	seg      *segment
	off      int64
	from, to uint64
}

// Entries returns the entries in [lo, hi), limited to maxSize bytes (as
// raft counts them) but at least one. It returns raft.ErrCompacted if lo is
// at or below the snapshot point and raft.ErrUnavailable if hi is beyond
// LastIndex()+1. Recent entries come from memory; older ones are read from
// their segments without holding the lock. The returned slice is the
// caller's; the entries must not be modified.
func (l *Log) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	l.mu.RLock()
	if l.mu.closed {
		l.mu.RUnlock()
		return nil, ErrClosed
	}
	m := l.mu.mem
	switch {
	case lo <= m.snapIndex:
		l.mu.RUnlock()
		return nil, raft.ErrCompacted
	case hi > m.last()+1:
		l.mu.RUnlock()
		return nil, raft.ErrUnavailable
	case lo > hi:
		l.mu.RUnlock()
		return nil, fmt.Errorf("raftlog: entries: lo %d > hi %d", lo, hi)
	}
	// Capture, under the lock, a consistent view: the frames for the part
	// on disk and the in-memory part, each with a reference to its segment.
	tf := m.tailFirst()
	var frames []frameRef
	for i := lo; i < min(hi, tf); i++ {
		p := m.pos.at(int(i - m.first))
		if n := len(frames); n == 0 || frames[n-1].seg != p.seg || frames[n-1].off != p.off {
			p.seg.acquire()
			frames = append(frames, frameRef{seg: p.seg, off: p.off, from: i})
		}
		frames[len(frames)-1].to = i + 1
	}
	var mem []*raftpb.Entry
	if hi > tf {
		mem = append(mem, m.tail[max(lo, tf)-tf:hi-tf]...)
	}
	l.mu.RUnlock()
	defer func() {
		for _, f := range frames {
			f.seg.release()
		}
	}()

	out := make([]*raftpb.Entry, 0, min(hi-lo, 1024))
	var size uint64
	// add appends e unless the size limit is reached; it reports whether
	// to go on.
	add := func(e *raftpb.Entry) bool {
		s := uint64(proto.Size(e))
		if len(out) > 0 && size+s > maxSize {
			return false
		}
		size += s
		out = append(out, e)
		return true
	}
	next := lo
	for _, f := range frames {
		entries, err := readBatch(f)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.GetIndex() != next || next >= f.to {
				continue
			}
			if !add(e) {
				return out, nil
			}
			next++
		}
	}
	if next != max(lo, min(hi, tf)) {
		return nil, fmt.Errorf("%w: entries %d..%d not found in their frames", ErrCorrupt, next, min(hi, tf)-1)
	}
	for _, e := range mem {
		if !add(e) {
			break
		}
	}
	return out, nil
}

// readBatch reads, verifies and decodes the batch frame f.
func readBatch(f frameRef) ([]*raftpb.Entry, error) {
	st, err := f.seg.f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat segment %s: %w", f.seg.name, err)
	}
	fh, payload, err := f.seg.readFrame(f.off, st.Size())
	if err != nil {
		return nil, err
	}
	if fh.typ == frameStripe {
		var inner byte
		if _, inner, payload, err = decodeStripe(payload); err != nil {
			return nil, fmt.Errorf("%w: %s at offset %d: %v", ErrCorrupt, f.seg.name, f.off, err)
		}
		fh.typ = inner
	}
	if fh.typ != frameBatch {
		return nil, fmt.Errorf("%w: %s at offset %d: frame type %d where a batch was indexed", ErrCorrupt, f.seg.name, f.off, fh.typ)
	}
	b, err := decodeBatchPayload(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: %s at offset %d: %v", ErrCorrupt, f.seg.name, f.off, err)
	}
	return b.entries, nil
}
