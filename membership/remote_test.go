package membership

import (
	"context"
	"net"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// listPeer answers MemberList with a fixed list, as a member serves it on
// its peer URLs.
type listPeer struct {
	pb.UnimplementedClusterServer
	id, cluster uint64
	members     []*pb.Member
}

func (p *listPeer) MemberList(context.Context, *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	return &pb.MemberListResponse{
		Header:  &pb.ResponseHeader{ClusterId: p.cluster, MemberId: p.id},
		Members: p.members,
	}, nil
}

// servePeer serves p on a loopback port and returns its peer URL.
func servePeer(t *testing.T, p *listPeer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterClusterServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return "http://" + lis.Addr().String()
}

// staticMembers is this member's own view of the member list.
type staticMembers []*pb.Member

func (s staticMembers) Members() []*pb.Member { return s }

// TestPeersRemoved: a member that removed itself learns the outcome from a
// peer's list (AwaitRemoval) only if
// that peer lists itself, that is, has applied its own addition. A member
// added to the cluster answers an empty list until the leader's snapshot
// or entries arrive; taking that for a list without this member made a
// one-member cluster's only voter (after --force-new-cluster, say) stop
// itself as removed when the member it had just added was slow to catch
// up and the voter, its quorum of two not active, had no leader for a
// moment.
func TestPeersRemoved(t *testing.T) {
	const self, peer, other, cluster = 1, 2, 3, 100
	for _, tc := range []struct {
		name    string
		answer  []*pb.Member
		removed bool
	}{
		{name: "listed", answer: []*pb.Member{{ID: self}, {ID: peer}}},
		{name: "removed", answer: []*pb.Member{{ID: peer}}, removed: true},
		{name: "the peer has applied nothing yet", answer: nil},
		{name: "the peer does not list itself", answer: []*pb.Member{{ID: other}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := servePeer(t, &listPeer{id: peer, cluster: cluster, members: tc.answer})
			p := &Peers{MemberID: self, ClusterID: cluster, Logger: zap.NewNop(),
				Members: staticMembers{{ID: self}, {ID: peer, PeerURLs: []string{u}}}}
			if _, got := p.listWithout(); got != tc.removed {
				t.Errorf("listWithout() = %v, want %v", got, tc.removed)
			}
		})
	}
}
