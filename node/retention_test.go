package node

import (
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestLogKeepersHoldTruncation: with LogRetention (--logger-retention), a
// leader never truncates its log past the lowest index a keeper (a logger
// learner) acknowledged (truncate.go, retention rule 1): nothing while the
// keeper acknowledged nothing, up to its Match once it did, up to the
// durable index less the catch-up margin once it is past that; without
// keepers, or for a member that is not a keeper, truncation is as before.
func TestLogKeepersHoldTruncation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		keepers []uint64
		off     bool     // LogRetention off
		acks    []uint64 // the learner's successive acknowledged indexes
		want    []uint64 // the log's first index after each truncation
		holds   bool     // LogKeptFor holds log compaction at each ack
	}{
		// The durable index is 40 and the margin 2: truncation to 38.
		{name: "no keepers", keepers: nil, acks: []uint64{0, 20}, want: []uint64{39, 39}},
		{name: "keeper not in the configuration", keepers: []uint64{9}, acks: []uint64{0, 20}, want: []uint64{39, 39}},
		{name: "retention off", keepers: []uint64{2}, off: true, acks: []uint64{0, 20}, want: []uint64{39, 39}},
		{name: "logger behind", keepers: []uint64{2}, acks: []uint64{0, 20, 40}, want: []uint64{1, 21, 39}, holds: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := logWithEntries(t, []uint64{1}, 40)
			n, err := New(Config{
				ID: 1, Log: log, Applied: 40, ConfState: &raftpb.ConfState{Voters: []uint64{1}, Learners: []uint64{2}},
				TickInterval: time.Hour, ElectionTicks: 10, HeartbeatTicks: 1, CatchUpEntries: 2,
				LogRetention: !tc.off, Logger: testLogger(t),
			})
			if err != nil {
				t.Fatal(err)
			}
			n.KeepLogFor(tc.keepers)
			// The test is the node goroutine: it elects the only voter and
			// performs its Readys by hand.
			if err := n.rn.Campaign(); err != nil {
				t.Fatal(err)
			}
			for n.rn.HasReady() {
				rd := n.rn.Ready()
				if err := log.Append(rd.Entries, rd.HardState); err != nil {
					t.Fatal(err)
				}
				n.rn.Advance(rd)
			}
			if st := n.rn.BasicStatus(); st.RaftState != raft.StateLeader {
				t.Fatalf("member 1 is %v, want leader", st.RaftState)
			}
			term := n.rn.BasicStatus().Term
			for i, ack := range tc.acks {
				if ack > 0 {
					if err := n.rn.Step(&raftpb.Message{Type: raftpb.MessageType_MsgAppResp.Enum(), From: proto.Uint64(2),
						To: proto.Uint64(1), Term: term, Index: proto.Uint64(ack)}); err != nil {
						t.Fatal(err)
					}
				}
				if err := n.compactLog(40); err != nil {
					t.Fatal(err)
				}
				if first, _ := log.FirstIndex(); first != tc.want[i] {
					t.Fatalf("after the learner acknowledged %d, the log starts at %d, want %d", ack, first, tc.want[i])
				}
				// What log compaction reads from another goroutine: as of
				// the last tick, everything held before the first.
				if idx, held := n.LogKeptFor(); held != !tc.off || idx != 0 {
					t.Fatalf("LogKeptFor before a tick = %d, %v; want 0, %v", idx, held, !tc.off)
				}
				n.publishKept()
				wantIdx := uint64(0)
				if tc.holds {
					wantIdx = ack
				}
				if idx, held := n.LogKeptFor(); held != tc.holds || idx != wantIdx {
					t.Fatalf("after the learner acknowledged %d: LogKeptFor = %d, %v; want %d, %v", ack, idx, held, wantIdx, tc.holds)
				}
				n.kept.Store(nil)
			}
		})
	}
}

// TestLogKeepersOnAFollower: a follower knows no learner's Match; it
// keeps its log back to the committed index each logger was last known to
// hold (LoggersHeld, retention rule 2): everything before it heard of the
// logger, up to what it holds after, and as without keepers once the
// logger holds more than the truncation point.
func TestLogKeepersOnAFollower(t *testing.T) {
	log := logWithEntries(t, []uint64{1, 3}, 40)
	n, err := New(Config{
		ID: 1, Log: log, Applied: 40, ConfState: &raftpb.ConfState{Voters: []uint64{1, 3}, Learners: []uint64{2}},
		TickInterval: time.Hour, ElectionTicks: 10, HeartbeatTicks: 1, CatchUpEntries: 2,
		LogRetention: true, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	n.KeepLogFor([]uint64{2})
	for _, step := range []struct {
		held      map[uint64]uint64 // nil: nothing reported
		wantFirst uint64
	}{
		{held: nil, wantFirst: 1},
		{held: map[uint64]uint64{9: 30}, wantFirst: 1}, // another member's report
		{held: map[uint64]uint64{2: 20}, wantFirst: 21},
		{held: map[uint64]uint64{2: 40}, wantFirst: 39},
	} {
		if step.held != nil {
			n.LoggersHeld(step.held)
		}
		if err := n.compactLog(40); err != nil {
			t.Fatal(err)
		}
		if first, _ := log.FirstIndex(); first != step.wantFirst {
			t.Fatalf("with the logger reported holding %v, the follower's log starts at %d, want %d", step.held, first, step.wantFirst)
		}
	}
}
