package raftlog

import (
	"fmt"
	"io"
	"log"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// raftHarness drives a single-voter raft.RawNode whose Storage is a Log, the
// way the node package does: one Append per Ready (HardState only when
// MustSync), apply, Advance.
type raftHarness struct {
	t       *testing.T
	l       *Log
	rn      *raft.RawNode
	applied []string
	last    uint64 // last applied index
}

// restartStorage raises the commit index to the applied index, as the node
// package does at start-up: commit-only HardStates are not synced, so the
// stored commit may trail what the engine applied.
type restartStorage struct {
	*Log
	applied uint64
}

func (s restartStorage) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	hs, cs, err := s.Log.InitialState()
	if err == nil && hs.GetCommit() < s.applied {
		hs.Commit = proto.Uint64(s.applied)
	}
	return hs, cs, err
}

func newRaftHarness(t *testing.T, l *Log, applied uint64) *raftHarness {
	rn, err := raft.NewRawNode(&raft.Config{
		ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: restartStorage{Log: l, applied: applied}, Applied: applied,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, MaxCommittedSizePerReady: 4 << 10,
		Logger: &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)},
	})
	if err != nil {
		t.Fatalf("NewRawNode: %v", err)
	}
	return &raftHarness{t: t, l: l, rn: rn, last: applied}
}

// drain handles Readies until there are none.
func (h *raftHarness) drain() {
	for h.rn.HasReady() {
		rd := h.rn.Ready()
		var hs *raftpb.HardState
		if rd.MustSync && !raft.IsEmptyHardState(rd.HardState) {
			hs = rd.HardState
		}
		if len(rd.Entries) > 0 || hs != nil {
			if err := h.l.Append(rd.Entries, hs); err != nil {
				h.t.Fatalf("Append: %v", err)
			}
		}
		for _, e := range rd.CommittedEntries {
			if e.GetType() == raftpb.EntryType_EntryNormal && len(e.GetData()) > 0 {
				h.applied = append(h.applied, string(e.GetData()))
			}
			h.last = e.GetIndex()
		}
		h.rn.Advance(rd)
	}
}

// TestRaftRawNode runs the real raft library on the Log: bootstrap through
// ApplySnapshot, elect, propose, compact below the applied index, restart
// from disk with small segments and a small in-memory tail, and keep going.
func TestRaftRawNode(t *testing.T) {
	fs := vfs.NewMem()
	opts := Options{FS: fs, Dirs: []string{testDir}, SegmentSize: 8 << 10, tailBudget: 2 << 10}
	l, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	// Bootstrap as etcd does for a new member: a snapshot carrying the
	// initial configuration.
	if err := l.ApplySnapshot(&raftpb.SnapshotMetadata{Index: proto.Uint64(1), Term: proto.Uint64(1),
		ConfState: &raftpb.ConfState{Voters: []uint64{1}}}); err != nil {
		t.Fatal(err)
	}
	h := newRaftHarness(t, l, 1)
	if err := h.rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	h.drain()
	var want []string
	propose := func(n int) {
		for i := 0; i < n; i++ {
			v := fmt.Sprintf("value-%d", len(want))
			want = append(want, v)
			if err := h.rn.Propose([]byte(v)); err != nil {
				t.Fatal(err)
			}
			if i%7 == 0 {
				h.drain()
			}
		}
		h.drain()
	}
	propose(300)
	// Compact as the node does, a few entries below the applied index (the
	// engine would hold them durably).
	if err := l.Compact(h.last-3, nil); err != nil {
		t.Fatalf("Compact(%d): %v", h.last-3, err)
	}
	propose(50)
	if len(h.applied) != len(want) {
		t.Fatalf("applied %d entries, proposed %d", len(h.applied), len(want))
	}

	// Restart from disk: raft reads its state and replays what the
	// "engine" had not applied.
	applied := h.last - 20
	_ = l.Close()
	if l, err = Open(opts); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	replay, err := l.Entries(applied+1, h.last+1, 1<<30)
	if err != nil {
		t.Fatalf("Entries for replay: %v", err)
	}
	var got []string
	for _, e := range replay {
		if e.GetType() == raftpb.EntryType_EntryNormal && len(e.GetData()) > 0 {
			got = append(got, string(e.GetData()))
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want[len(want)-len(got):]) || len(got) < 15 {
		t.Fatalf("replayed %v, want the tail of %d proposals", got, len(want))
	}
	h2 := newRaftHarness(t, l, applied)
	h2.applied = nil
	if err := h2.rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	h2.drain()
	h = h2
	before := len(want)
	propose(30)
	if n := len(h.applied); n < len(want)-before {
		t.Fatalf("after restart applied %d new entries, want >= %d", n, len(want)-before)
	}
	if got := h.applied[len(h.applied)-1]; got != want[len(want)-1] {
		t.Fatalf("last applied %q, want %q", got, want[len(want)-1])
	}
}
