package memberlist

import (
	"errors"
	"slices"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

func change(typ raftpb.ConfChangeType, id uint64, m *pb.Member) Change {
	return Change{Changes: []*raftpb.ConfChangeSingle{{Type: typ.Enum(), NodeId: proto.Uint64(id)}}, Member: m}
}

// Each change meets the list the changes before it produced: two changes
// that each passed the proposer's check against the same list are decided
// one after the other, as etcd decides them when they apply.
func TestChangesCheckedInOrder(t *testing.T) {
	voter := func(id uint64, url string) *pb.Member {
		return &pb.Member{ID: id, Name: "m", PeerURLs: []string{url}}
	}
	learner := func(id uint64, url string) *pb.Member {
		m := voter(id, url)
		m.IsLearner = true
		return m
	}
	loggerMember := &pb.Member{ID: 5, Name: "L1", IsLearner: true, PeerURLs: []string{"http://l:1"},
		ClientURLs: []string{"http://l:2" + LoggerURLPath}}
	for _, tc := range []struct {
		name        string
		start       List
		maxLearners int
		changes     []Change
		want        []error // one per change
		wantIDs     []uint64
		wantRemoved []uint64
	}{{
		name:    "promotion after the learner's removal",
		start:   List{Members: []*pb.Member{voter(1, "http://a:1"), learner(2, "http://b:1")}},
		changes: []Change{change(raftpb.ConfChangeRemoveNode, 2, nil), change(raftpb.ConfChangeAddNode, 2, voter(2, "http://b:1"))},
		want:    []error{nil, ErrIDRemoved}, wantIDs: []uint64{1}, wantRemoved: []uint64{2},
	}, {
		name:    "removal after the promotion",
		start:   List{Members: []*pb.Member{voter(1, "http://a:1"), learner(2, "http://b:1")}},
		changes: []Change{change(raftpb.ConfChangeAddNode, 2, voter(2, "http://b:1")), change(raftpb.ConfChangeRemoveNode, 2, nil)},
		want:    []error{nil, nil}, wantIDs: []uint64{1}, wantRemoved: []uint64{2},
	}, {
		name:    "two learners past the limit",
		start:   List{Members: []*pb.Member{voter(1, "http://a:1")}},
		changes: []Change{change(raftpb.ConfChangeAddLearnerNode, 3, learner(3, "http://c:1")), change(raftpb.ConfChangeAddLearnerNode, 4, learner(4, "http://d:1"))},
		want:    []error{nil, ErrTooManyLearners}, wantIDs: []uint64{1, 3},
	}, {
		name:        "two learners within a limit of two",
		start:       List{Members: []*pb.Member{voter(1, "http://a:1")}},
		maxLearners: 2,
		changes:     []Change{change(raftpb.ConfChangeAddLearnerNode, 3, learner(3, "http://c:1")), change(raftpb.ConfChangeAddLearnerNode, 4, learner(4, "http://d:1"))},
		want:        []error{nil, nil}, wantIDs: []uint64{1, 3, 4},
	}, {
		name:    "a logger does not count against the limit",
		start:   List{Members: []*pb.Member{voter(1, "http://a:1"), loggerMember}},
		changes: []Change{change(raftpb.ConfChangeAddLearnerNode, 3, learner(3, "http://c:1"))},
		want:    []error{nil}, wantIDs: []uint64{1, 3, 5},
	}, {
		name:    "a retried add under another ID with the same peer URL",
		start:   List{Members: []*pb.Member{voter(1, "http://a:1")}},
		changes: []Change{change(raftpb.ConfChangeAddNode, 3, voter(3, "http://c:1")), change(raftpb.ConfChangeAddNode, 4, voter(4, "http://c:1"))},
		want:    []error{nil, ErrPeerURLExists}, wantIDs: []uint64{1, 3},
	}, {
		name:    "an ID added again after its removal",
		start:   List{Members: []*pb.Member{voter(1, "http://a:1")}, Removed: []uint64{9}},
		changes: []Change{change(raftpb.ConfChangeAddNode, 9, voter(9, "http://c:1"))},
		want:    []error{ErrIDRemoved}, wantIDs: []uint64{1}, wantRemoved: []uint64{9},
	}, {
		name:  "removal and update of unknown IDs, update to a taken URL",
		start: List{Members: []*pb.Member{voter(1, "http://a:1"), voter(2, "http://b:1")}},
		changes: []Change{change(raftpb.ConfChangeRemoveNode, 7, nil), change(raftpb.ConfChangeUpdateNode, 7, voter(7, "http://x:1")),
			change(raftpb.ConfChangeUpdateNode, 2, voter(2, "http://a:1")), change(raftpb.ConfChangeUpdateNode, 2, voter(2, "http://b:2"))},
		want: []error{ErrIDNotFound, ErrIDNotFound, ErrPeerURLExists, nil}, wantIDs: []uint64{1, 2},
	}, {
		name:    "promotion of a voter, of a logger",
		start:   List{Members: []*pb.Member{voter(1, "http://a:1"), loggerMember}},
		changes: []Change{change(raftpb.ConfChangeAddNode, 1, voter(1, "http://a:1")), change(raftpb.ConfChangeAddNode, 5, voter(5, "http://l:1"))},
		want:    []error{ErrMemberNotLearner, ErrLoggerNotPromotable}, wantIDs: []uint64{1, 5},
	}, {
		// Raft's configuration holds 8, the list lost it: the removal
		// applies, or raft would keep a voter nothing could remove.
		name:    "removal of an ID only raft's configuration holds",
		start:   List{Members: []*pb.Member{voter(1, "http://a:1")}, Removed: []uint64{8}, Config: &raftpb.ConfState{Voters: []uint64{1, 8}}},
		changes: []Change{change(raftpb.ConfChangeRemoveNode, 8, nil), change(raftpb.ConfChangeRemoveNode, 9, nil)},
		want:    []error{nil, ErrIDNotFound}, wantIDs: []uint64{1}, wantRemoved: []uint64{8},
	}, {
		name:    "a learner added under a member's ID",
		start:   List{Members: []*pb.Member{voter(1, "http://a:1")}},
		changes: []Change{change(raftpb.ConfChangeAddLearnerNode, 1, learner(1, "http://z:1"))},
		want:    []error{ErrIDExists}, wantIDs: []uint64{1},
	}, {
		name:  "a version-2 change is never refused",
		start: List{Members: []*pb.Member{voter(1, "http://a:1")}},
		changes: []Change{{V2: true, Changes: []*raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode.Enum(), NodeId: proto.Uint64(3)}},
			Member: voter(3, "http://a:1")}},
		want: []error{nil}, wantIDs: []uint64{1, 3},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.start
			before := slices.Clone(l.Members)
			for i, c := range tc.changes {
				checked := l.Check(c, tc.maxLearners)
				_, refused := l.Apply(c, tc.maxLearners)
				if !errors.Is(refused, tc.want[i]) || (tc.want[i] == nil) != (refused == nil) {
					t.Fatalf("change %d: refused %v, want %v", i, refused, tc.want[i])
				}
				if (checked == nil) != (refused == nil) {
					t.Fatalf("change %d: Check said %v, Apply %v", i, checked, refused)
				}
			}
			var ids []uint64
			for _, m := range l.Members {
				ids = append(ids, m.ID)
			}
			if !slices.Equal(ids, tc.wantIDs) || !slices.Equal(l.Removed, tc.wantRemoved) {
				t.Fatalf("members %v removed %v, want %v and %v", ids, l.Removed, tc.wantIDs, tc.wantRemoved)
			}
			// The starting list's slice and records are untouched.
			for i, m := range tc.start.Members {
				if before[i] != m {
					t.Fatalf("the starting list's record %d was replaced in place", i)
				}
			}
		})
	}
}

func TestPromotionKeepsRecord(t *testing.T) {
	l := List{Members: []*pb.Member{{ID: 2, Name: "m2", IsLearner: true, PeerURLs: []string{"http://b:1"}, ClientURLs: []string{"http://b:2"}}}}
	rec := l.Members[0]
	if _, refused := l.Apply(change(raftpb.ConfChangeAddNode, 2, &pb.Member{ID: 2, PeerURLs: []string{"http://b:1"}}), 0); refused != nil {
		t.Fatal(refused)
	}
	got := l.Members[0]
	if got.IsLearner || got.Name != "m2" || !slices.Equal(got.ClientURLs, []string{"http://b:2"}) {
		t.Fatalf("promoted record %v", got)
	}
	if !rec.IsLearner {
		t.Fatal("the old record was changed in place")
	}
}
