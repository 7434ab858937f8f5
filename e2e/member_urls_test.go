package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestMemberAddPeerURLs: MemberAdd takes peer URLs by etcd's rules
// (types.NewURLs), on strata as on etcd: a URL without a port or with a
// path is refused with "member peer urls are bad"; spaces are trimmed and
// the member records its URLs sorted. strata took both refused forms and
// kept URLs as given (found by review).
func TestMemberAddPeerURLs(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			p := start(t, f)
			cli := p.Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			// clientv3 checks the URLs itself: send the requests as they are.
			cluster := pb.NewClusterClient(cli.ActiveConnection())
			for _, bad := range [][]string{{"http://127.0.0.1"}, {"http://127.0.0.1:2390/x"}, {"ftp://127.0.0.1:2390"}} {
				_, err := cluster.MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: bad, IsLearner: true})
				if status.Code(err) != codes.InvalidArgument || rpctypes.ErrorDesc(err) != rpctypes.ErrorDesc(rpctypes.ErrGRPCMemberBadURLs) {
					t.Errorf("member add %q: %v, want %v", bad, err, rpctypes.ErrGRPCMemberBadURLs)
				}
			}
			resp, err := cluster.MemberAdd(ctx, &pb.MemberAddRequest{PeerURLs: []string{" http://127.0.0.1:2391 ", "http://127.0.0.1:2390"}, IsLearner: true})
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"http://127.0.0.1:2390", "http://127.0.0.1:2391"}
			if !slices.Equal(resp.Member.PeerURLs, want) {
				t.Errorf("added member's peer URLs %q, want %q", resp.Member.PeerURLs, want)
			}
			list, err := cli.MemberList(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range list.Members {
				if m.ID == resp.Member.ID && !slices.Equal(m.PeerURLs, want) {
					t.Errorf("listed peer URLs %q, want %q", m.PeerURLs, want)
				}
			}
		})
	}
}
