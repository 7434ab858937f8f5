package apply

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/membership/memberlist"
	"github.com/strata-kv/strata/node"
)

// Two membership changes proposed at once both passed the proposer's
// check: the promotion of learner 2 and its removal. Committed removal
// first, the promotion is refused as it applies: the node is told to hand
// raft no change (Decide), the waiting caller gets etcd's refusal, and the
// member list does not bring 2 back as a voter. The refusal and the removed
// ID are kept, so that a restart decides a redelivered entry the same way.
func TestMembershipChangeRefusedAsItApplies(t *testing.T) {
	fs := vfs.NewMem()
	eng, store := openStore(t, fs)
	a, err := New(Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan node.Committed, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, in) }()

	// decideAndApply hands e to the applier as the node does: the
	// question first, then the entry with the conf state raft reached.
	decideAndApply := func(e *raftpb.Entry, cs *raftpb.ConfState) error {
		t.Helper()
		answer := make(chan error, 1)
		in <- node.Committed{Decide: e, Decision: answer}
		var refused error
		select {
		case refused = <-answer:
		case <-time.After(5 * time.Second):
			t.Fatalf("no decision for entry %d", e.GetIndex())
		}
		in <- node.Committed{Entries: []*raftpb.Entry{e}, ConfStates: map[uint64]*raftpb.ConfState{e.GetIndex(): cs}}
		return refused
	}
	one := &raftpb.ConfState{Voters: []uint64{1}}
	withLearner := &raftpb.ConfState{Voters: []uint64{1}, Learners: []uint64{2}}
	for i, e := range []*raftpb.Entry{
		confChange(t, 1, 0, raftpb.ConfChangeAddNode, &pb.Member{ID: 1, PeerURLs: []string{"http://a:1"}}),
		confChange(t, 2, 0, raftpb.ConfChangeAddLearnerNode, &pb.Member{ID: 2, PeerURLs: []string{"http://b:1"}, IsLearner: true}),
	} {
		cs := []*raftpb.ConfState{one, withLearner}[i]
		if refused := decideAndApply(e, cs); refused != nil {
			t.Fatalf("entry %d refused: %v", e.GetIndex(), refused)
		}
	}
	removal := a.cfg.Waiters.Register(31)
	promotion := a.cfg.Waiters.Register(32)
	if refused := decideAndApply(confChange(t, 3, 31, raftpb.ConfChangeRemoveNode, &pb.Member{ID: 2}), one); refused != nil {
		t.Fatalf("removal refused: %v", refused)
	}
	promote := confChange(t, 4, 32, raftpb.ConfChangeAddNode, &pb.Member{ID: 2, PeerURLs: []string{"http://b:1"}})
	if refused := decideAndApply(promote, one); !errors.Is(refused, memberlist.ErrIDRemoved) {
		t.Fatalf("promotion of a removed learner decided %v, want %v", refused, memberlist.ErrIDRemoved)
	}
	for _, w := range []struct {
		name string
		c    <-chan Result
		want error
	}{{"removal", removal, nil}, {"promotion", promotion, memberlist.ErrIDRemoved}} {
		select {
		case res := <-w.c:
			if !errors.Is(res.Err, w.want) || (w.want == nil) != (res.Err == nil) {
				t.Fatalf("%s answered %v, want %v", w.name, res.Err, w.want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no answer", w.name)
		}
	}
	if err := a.WaitApplied(context.Background(), 4); err != nil {
		t.Fatal(err)
	}
	if got := a.Members(); len(got) != 1 || got[0].ID != 1 {
		t.Fatalf("members %v, want only 1", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopened, the applier knows the removed ID and the refusal: entry 4
	// redelivered (an engine that lost its conf state) is refused again,
	// entry 3 is not, and a new addition of 2 is refused.
	eng2, store2 := openStore(t, fs)
	defer eng2.Close()
	st, err := ReadClusterState(store2.Reader())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Removed, []uint64{2}) {
		t.Fatalf("removed %v after reopen, want [2]", st.Removed)
	}
	a2, err := New(Config{Store: store2})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		e       *raftpb.Entry
		refused bool
	}{
		{confChange(t, 3, 0, raftpb.ConfChangeRemoveNode, &pb.Member{ID: 2}), false},
		{promote, true},
		{confChange(t, 5, 0, raftpb.ConfChangeAddLearnerNode, &pb.Member{ID: 2, PeerURLs: []string{"http://b:1"}, IsLearner: true}), true},
	} {
		refused, err := a2.decide(tc.e)
		if err != nil {
			t.Fatal(err)
		}
		if (refused != nil) != tc.refused {
			t.Fatalf("entry %d after reopen decided %v, want refused %v", tc.e.GetIndex(), refused, tc.refused)
		}
	}
}

// A member list rebuilt from redelivered entries (an engine that lost it
// with its conf state) takes each change's first decision, as raft gets it
// (Applier.decide): a change refused when it first applied stays refused,
// one applied stays applied, without being checked again against a list
// that may lack what the log's compacted part had added (found by review).
func TestRebuiltListKeepsDecisions(t *testing.T) {
	ms := &memberState{refused: []uint64{3}}
	for _, e := range []*raftpb.Entry{
		confChange(t, 1, 0, raftpb.ConfChangeAddNode, &pb.Member{ID: 7, PeerURLs: []string{"http://a:1"}}),
		// 5 was added in the log's compacted part: its removal applied.
		confChange(t, 2, 0, raftpb.ConfChangeRemoveNode, &pb.Member{ID: 5}),
		// Refused when first applied (its peer URL was taken then).
		confChange(t, 3, 0, raftpb.ConfChangeAddNode, &pb.Member{ID: 9, PeerURLs: []string{"http://b:1"}}),
	} {
		if err := ms.reapplyChange(e); err != nil {
			t.Fatal(err)
		}
	}
	if got := ms.list.Members; len(got) != 1 || got[0].ID != 7 {
		t.Fatalf("rebuilt members %v, want only 7", got)
	}
	if !slices.Equal(ms.list.Removed, []uint64{5}) || !slices.Equal(ms.refused, []uint64{3}) || ms.changedRefused {
		t.Fatalf("removed %v, refused %v (changed %v)", ms.list.Removed, ms.refused, ms.changedRefused)
	}
}

// A simple token ends with the raft index of the Authenticate entry that
// issued it, as etcd's, so that a member that has not applied that index
// knows to wait for it (server.Auth.callerInfo).
func TestSimpleTokenEndsWithItsIndex(t *testing.T) {
	m := newAuthMember(t)
	h, err := m.auth.HashPassword("bpw")
	if err != nil {
		t.Fatal(err)
	}
	m.apply(t, []*raftpb.Entry{
		normal(t, 1, &pb.InternalRaftRequest{AuthUserAdd: &pb.AuthUserAddRequest{Name: "root", Options: &authpb.UserAddOptions{NoPassword: true}}}),
		normal(t, 2, &pb.InternalRaftRequest{AuthUserGrantRole: &pb.AuthUserGrantRoleRequest{User: "root", Role: "root"}}),
		normal(t, 3, &pb.InternalRaftRequest{AuthEnable: &pb.AuthEnableRequest{}}),
		normal(t, 4, &pb.InternalRaftRequest{AuthUserAdd: &pb.AuthUserAddRequest{Name: "bob", HashedPassword: h}}),
		normal(t, 5, &pb.InternalRaftRequest{Authenticate: &pb.InternalAuthenticateRequest{Name: "bob", SimpleToken: "prefix"}}),
	})
	info, err := m.auth.TokenInfo(auth.SimpleToken("prefix", 5))
	if err != nil || info.Username != "bob" {
		t.Fatalf("the token of entry 5: %v, %v", info, err)
	}
	if _, err := m.auth.TokenInfo("prefix"); err == nil {
		t.Fatal("the bare prefix is a token")
	}
}
