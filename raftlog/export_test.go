package raftlog

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

// TestReadEntriesKeepsCompactedAndResolvesConflicts: ReadEntries returns the
// entries below the snapshot point that the segment still holds, with a
// later batch replacing the entries it conflicts with, and the last
// HardState; it matches what Open serves above the snapshot point.
func TestReadEntriesKeepsCompactedAndResolvesConflicts(t *testing.T) {
	fs := vfs.NewMem()
	l := openLog(t, fs, 0)
	mustAppend(t, l, ents(1, 30, 1), hs(1, 1, 10))
	mustAppend(t, l, ents(21, 40, 2), hs(2, 2, 35))
	if err := l.Compact(25, &raftpb.ConfState{Voters: []uint64{1}}); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, ents(41, 45, 2), hs(2, 2, 45))
	h, got, err := ReadEntries(fs, testDir)
	if err != nil {
		t.Fatal(err)
	}
	want := append(ents(1, 20, 1), ents(21, 45, 2)...)
	if err := sameEntries(got, want); err != nil {
		t.Fatal(err)
	}
	if h.GetTerm() != 2 || h.GetVote() != 2 || h.GetCommit() != 45 {
		t.Fatalf("HardState %v, want term 2 vote 2 commit 45", h)
	}
	// ReadEntries modified nothing: the log reopens with the same tail.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLog(t, fs, 0)
	defer l.Close()
	live, err := l.Entries(26, 46, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if err := sameEntries(live, got[25:]); err != nil {
		t.Fatal(err)
	}
}

// TestReadEntriesAfterSegmentDeletion: once compaction deleted the oldest
// segments, ReadEntries starts at the oldest segment left, contiguous to
// the end.
func TestReadEntriesAfterSegmentDeletion(t *testing.T) {
	fs := vfs.NewMem()
	l := openLog(t, fs, 4<<10)
	for i := uint64(0); i < 20; i++ {
		mustAppend(t, l, ents(i*20+1, i*20+20, 1), hs(1, 1, i*20+20))
	}
	if err := l.Compact(300, &raftpb.ConfState{Voters: []uint64{1}}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, got, err := ReadEntries(fs, testDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || got[0].GetIndex() == 1 || got[len(got)-1].GetIndex() != 400 {
		t.Fatalf("got %d entries from %d, want fewer than 400 starting after 1, ending at 400", len(got), got[0].GetIndex())
	}
	if err := sameEntries(got, ents(got[0].GetIndex(), 400, 1)); err != nil {
		t.Fatal(err)
	}
}
