package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// TestPeerURLServesOnlyMemberList: a strata member serves the Cluster
// service on its peer URL for joining members, which only list the
// members there. etcd's peer URL lists members and forwards promotions,
// and changes membership only through the client API, where auth decides;
// strata's peer URL served every membership change to anyone who reached
// it, without auth (found by review): MemberAdd there added a member.
func TestPeerURLServesOnlyMemberList(t *testing.T) {
	p := start(t, strata)
	addr := strings.TrimPrefix(p.ListenPeerURL(), "http://")
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	peer := pb.NewClusterClient(conn)

	list, err := peer.MemberList(ctx, &pb.MemberListRequest{})
	if err != nil || len(list.Members) != 1 {
		t.Fatalf("MemberList on the peer URL: %v, %v; want the one member", list, err)
	}
	id := list.Members[0].ID
	for name, call := range map[string]func() error{
		"MemberAdd": func() error {
			_, err := peer.MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: []string{"http://127.0.0.1:1"}, IsLearner: true})
			return err
		},
		"MemberRemove": func() error { _, err := peer.MemberRemove(ctx, &pb.MemberRemoveRequest{ID: id}); return err },
		"MemberUpdate": func() error {
			_, err := peer.MemberUpdate(ctx, &pb.MemberUpdateRequest{ID: id, PeerURLs: []string{"http://127.0.0.1:2"}})
			return err
		},
		"MemberPromote": func() error { _, err := peer.MemberPromote(ctx, &pb.MemberPromoteRequest{ID: id}); return err },
	} {
		if err := call(); status.Code(err) != codes.Unimplemented {
			t.Errorf("%s on the peer URL: %v; want code Unimplemented", name, err)
		}
	}
	cli := p.Client(t)
	resp, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Members) != 1 || resp.Members[0].PeerURLs[0] != list.Members[0].PeerURLs[0] {
		t.Fatalf("members after the peer URL's refusals: %v; want the one member, unchanged", resp.Members)
	}
}
