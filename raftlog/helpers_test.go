package raftlog

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/protobuf/proto"
)

const testDir = "wal"

// ent builds an entry whose data names its index and term.
func ent(index, term uint64) *raftpb.Entry {
	return &raftpb.Entry{
		Index: proto.Uint64(index),
		Term:  proto.Uint64(term),
		Type:  raftpb.EntryType_EntryNormal.Enum(),
		Data:  []byte(fmt.Sprintf("entry %d term %d", index, term)),
	}
}

// ents builds entries lo..hi (inclusive) of one term.
func ents(lo, hi, term uint64) []*raftpb.Entry {
	var out []*raftpb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, ent(i, term))
	}
	return out
}

func hs(term, vote, commit uint64) *raftpb.HardState {
	return &raftpb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(vote), Commit: proto.Uint64(commit)}
}

// openLog opens the test log; segSize 0 means 64 KiB, which keeps tests
// fast (the default of 64 MiB is zero-filled and scanned at every open).
func openLog(t testing.TB, fs vfs.FS, segSize int64) *Log {
	t.Helper()
	if segSize == 0 {
		segSize = 64 << 10
	}
	l, err := Open(Options{FS: fs, Dirs: []string{testDir}, SegmentSize: segSize})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return l
}

// openObserved opens with a logger whose output the test can read.
func openObserved(t testing.TB, fs vfs.FS, segSize int64) (*Log, *observer.ObservedLogs, error) {
	t.Helper()
	core, logs := observer.New(zap.WarnLevel)
	l, err := Open(Options{FS: fs, Dirs: []string{testDir}, SegmentSize: segSize, Logger: zap.New(core)})
	return l, logs, err
}

// reopen closes l and opens the log again with opts; the test's cleanup
// closes the new one.
func reopen(t testing.TB, l *Log, opts Options) *Log {
	t.Helper()
	_ = l.Close()
	l, err := Open(opts)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func mustAppend(t testing.TB, l *Log, entries []*raftpb.Entry, h *raftpb.HardState) {
	t.Helper()
	if err := l.Append(entries, h); err != nil {
		t.Fatalf("Append: %v", err)
	}
}

// sameEntries compares entries by their fields.
func sameEntries(a, b []*raftpb.Entry) error {
	if len(a) != len(b) {
		return fmt.Errorf("got %d entries, want %d", len(a), len(b))
	}
	for i := range a {
		if a[i].GetIndex() != b[i].GetIndex() || a[i].GetTerm() != b[i].GetTerm() ||
			a[i].GetType() != b[i].GetType() || !bytes.Equal(a[i].GetData(), b[i].GetData()) {
			return fmt.Errorf("entry %d: got (%d,%d,%q), want (%d,%d,%q)", i,
				a[i].GetIndex(), a[i].GetTerm(), a[i].GetData(), b[i].GetIndex(), b[i].GetTerm(), b[i].GetData())
		}
	}
	return nil
}

// checkLog verifies every raft.Storage read against the expected state.
func checkLog(t testing.TB, l *Log, snapIndex, snapTerm uint64, want []*raftpb.Entry, wantHS hardState) {
	t.Helper()
	first, err := l.FirstIndex()
	if err != nil || first != snapIndex+1 {
		t.Fatalf("FirstIndex = %d, %v; want %d", first, err, snapIndex+1)
	}
	last, err := l.LastIndex()
	if err != nil || last != snapIndex+uint64(len(want)) {
		t.Fatalf("LastIndex = %d, %v; want %d", last, err, snapIndex+uint64(len(want)))
	}
	got, err := l.Entries(first, last+1, 1<<62)
	if err != nil {
		t.Fatalf("Entries(%d, %d): %v", first, last+1, err)
	}
	if err := sameEntries(got, want); err != nil {
		t.Fatalf("Entries(%d, %d): %v", first, last+1, err)
	}
	if term, err := l.Term(snapIndex); err != nil || term != snapTerm {
		t.Fatalf("Term(%d) = %d, %v; want %d", snapIndex, term, err, snapTerm)
	}
	for _, e := range want {
		if term, err := l.Term(e.GetIndex()); err != nil || term != e.GetTerm() {
			t.Fatalf("Term(%d) = %d, %v; want %d", e.GetIndex(), term, err, e.GetTerm())
		}
	}
	h, _, err := l.InitialState()
	if err != nil || hardStateOf(h) != wantHS {
		t.Fatalf("InitialState = %v, %v; want %+v", h, err, wantHS)
	}
	snap, err := l.Snapshot()
	if err != nil || snap.GetMetadata().GetIndex() != snapIndex || snap.GetMetadata().GetTerm() != snapTerm {
		t.Fatalf("Snapshot = %v, %v; want (%d, %d)", snap, err, snapIndex, snapTerm)
	}
}

// sameConfState compares conf states by value (proto2 presence aside).
func sameConfState(a, b *raftpb.ConfState) bool {
	return slices.Equal(a.GetVoters(), b.GetVoters()) && slices.Equal(a.GetLearners(), b.GetLearners()) &&
		slices.Equal(a.GetVotersOutgoing(), b.GetVotersOutgoing()) &&
		slices.Equal(a.GetLearnersNext(), b.GetLearnersNext()) && a.GetAutoLeave() == b.GetAutoLeave()
}
