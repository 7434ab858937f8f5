package member

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/membership/memberlist"
)

// A membership change that passed the proposer's check against an older
// member list is checked again as it applies. Here a learner is removed and
// then "promoted" (a voter added under its ID), as a promotion racing the
// removal commits: before, the applier and raft both took the removed
// learner back as a voter, and a cluster of one counted a member that does
// not exist in its quorum, so no write committed again. Now the promotion is
// refused with etcd's error, raft's configuration and the member list stay
// as the removal left them, and the member goes on writing.
func TestChangeRefusedAsItApplies(t *testing.T) {
	m := startOn(t, vfs.NewMem())
	defer m.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const learnerID = 0x2a
	change := func(typ raftpb.ConfChangeType, rec *pb.Member) error {
		cc := &raftpb.ConfChange{Type: typ.Enum(), NodeId: proto.Uint64(learnerID)}
		if rec != nil {
			raw, err := proto.Marshal(rec)
			if err != nil {
				t.Fatal(err)
			}
			cc.Context = raw
		}
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		resc, forget, err := m.proposer.ProposeConfChange(cctx, cc)
		if err != nil {
			return err
		}
		defer forget()
		select {
		case res := <-resc:
			return res.Err
		case <-cctx.Done():
			return fmt.Errorf("%s of %x: no answer: %w", typ, learnerID, cctx.Err())
		}
	}
	rec := &pb.Member{ID: learnerID, PeerURLs: []string{"http://127.0.0.1:1"}, IsLearner: true}
	if err := change(raftpb.ConfChangeAddLearnerNode, rec); err != nil {
		t.Fatalf("add learner: %v", err)
	}
	if err := change(raftpb.ConfChangeRemoveNode, nil); err != nil {
		t.Fatalf("remove learner: %v", err)
	}
	promoted := proto.CloneOf(rec)
	promoted.IsLearner = false
	if err := change(raftpb.ConfChangeAddNode, promoted); !errors.Is(err, memberlist.ErrIDRemoved) {
		t.Fatalf("promotion of the removed learner answered %v, want %v", err, memberlist.ErrIDRemoved)
	}
	id := m.MemberID()
	if ms := m.Members(); len(ms) != 1 || ms[0].ID != id {
		t.Fatalf("members %v, want only %x", ms, id)
	}
	st, err := m.node.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	voters := st.Config.Voters.IDs()
	if _, ok := voters[id]; !ok || len(voters) != 1 {
		t.Fatalf("raft's voters %v, want only %x", voters, id)
	}
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	defer pcancel()
	if _, err := m.Propose(pctx, &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte("k"), Value: []byte("v")}}); err != nil {
		t.Fatalf("write after the refused promotion: %v", err)
	}
}
