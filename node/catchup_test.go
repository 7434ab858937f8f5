package node

import (
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// TestCatchUpMessage: the append AppendCommitted steps (catchup.go, rules
// 1 and 3) comes from the leader the member follows, at its term, after its
// commit index with that entry's term, and carries entries of no later
// term; a member that no longer follows that leader at that term hands
// nothing over. Stepped into raft, the append is persisted and answered to
// the leader at its last index (rule 4).
func TestCatchUpMessage(t *testing.T) {
	log := logWithEntries(t, []uint64{1, 2}, 40)
	n, err := New(Config{
		ID: 1, Log: log, Applied: 40, ConfState: &raftpb.ConfState{Voters: []uint64{1, 2}},
		TickInterval: time.Hour, ElectionTicks: 10, HeartbeatTicks: 1, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	// The test is the node goroutine: member 2 leads at term 2.
	ready := func() []*raftpb.Message {
		var msgs []*raftpb.Message
		for n.rn.HasReady() {
			rd := n.rn.Ready()
			if err := log.Append(rd.Entries, rd.HardState); err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, rd.Messages...)
			n.rn.Advance(rd)
		}
		return msgs
	}
	if err := n.rn.Step(&raftpb.Message{Type: raftpb.MessageType_MsgHeartbeat.Enum(), From: proto.Uint64(2), To: proto.Uint64(1),
		Term: proto.Uint64(2), Commit: proto.Uint64(40)}); err != nil {
		t.Fatal(err)
	}
	ready()
	if st := n.rn.BasicStatus(); st.RaftState != raft.StateFollower || st.Lead != 2 {
		t.Fatalf("member 1 is %v of %d, want a follower of 2", st.RaftState, st.Lead)
	}
	entries := func(terms ...uint64) []*raftpb.Entry {
		var es []*raftpb.Entry
		for i, term := range terms {
			es = append(es, &raftpb.Entry{Index: proto.Uint64(41 + uint64(i)), Term: proto.Uint64(term), Type: raftpb.EntryNormal.Enum(), Data: []byte("y")})
		}
		return es
	}
	here := CommitPoint{Commit: 40, Term: 2, Leader: 2}
	for _, tt := range []struct {
		name    string
		from    CommitPoint
		entries []*raftpb.Entry
		want    int // entries handed over; 0: no message
	}{
		{name: "another leader", from: CommitPoint{Commit: 40, Term: 2, Leader: 3}, entries: entries(2, 2)},
		{name: "an older term", from: CommitPoint{Commit: 40, Term: 1, Leader: 2}, entries: entries(1, 1)},
		{name: "entries of a later term only", from: here, entries: entries(3, 3)},
		{name: "cut at a later term", from: here, entries: entries(1, 2, 3), want: 2},
		{name: "all", from: here, entries: entries(1, 2, 2, 2), want: 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := n.catchUpMessage(n.rn, tt.from, tt.entries)
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == 0 {
				if m != nil {
					t.Fatalf("handed over %v", m)
				}
				return
			}
			if m == nil || m.GetFrom() != 2 || m.GetTerm() != 2 || m.GetIndex() != 40 || m.GetLogTerm() != 1 ||
				len(m.Entries) != tt.want || m.GetCommit() != 40+uint64(tt.want) {
				t.Fatalf("message %v; want an append from 2 at term 2 after index 40 (term 1) with %d entries committing %d", m, tt.want, 40+tt.want)
			}
		})
	}
	m, err := n.catchUpMessage(n.rn, here, entries(1, 2, 2, 2))
	if err != nil || m == nil {
		t.Fatal(m, err)
	}
	if err := n.rn.Step(m); err != nil {
		t.Fatal(err)
	}
	msgs := ready()
	if last, _ := log.LastIndex(); last != 44 {
		t.Fatalf("the log ends at %d after the catch-up, want 44", last)
	}
	var answered bool
	for _, m := range msgs {
		if m.GetType() == raftpb.MessageType_MsgAppResp && m.GetTo() == 2 && m.GetIndex() == 44 && !m.GetReject() {
			answered = true
		}
	}
	if !answered {
		t.Errorf("no MsgAppResp at 44 to the leader among %v", msgs)
	}
	// A candidate follows no leader: it hands nothing over.
	if err := n.rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	ready()
	if m, err := n.catchUpMessage(n.rn, CommitPoint{Commit: 44, Term: 2, Leader: 2}, nil); m != nil || err != nil {
		t.Errorf("a candidate handed over %v, %v", m, err)
	}
}
