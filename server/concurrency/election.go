package concurrency

import (
	"context"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"

	"github.com/strata-kv/strata/server/concurrency/v3electionpb"
)

// The election errors, with etcd's texts.
var (
	// ErrElectionNotLeader: the leader key given is no longer the leader's.
	ErrElectionNotLeader = errors.New("election: not leader")
	// ErrElectionNoLeader: nobody is campaigning.
	ErrElectionNoLeader = errors.New("election: no leader")
	// ErrMissingLeaderKey: Proclaim or Resign without a leader key.
	ErrMissingLeaderKey = errors.New(`"leader" field must be provided`)
)

// Election implements etcd's v3election service (see the package comment
// for the recipe). The leader is the campaigner whose key under
// "<name>/" has the lowest create revision; its value is the leader's
// proclamation.
type Election struct {
	v3electionpb.UnimplementedElectionServer
	r recipe
}

// NewElection returns the Election service over b.
func NewElection(b Backend) *Election { return &Election{r: newRecipe(b)} }

// Campaign waits until the caller leads the election and returns its
// leader key. A campaigner whose key exists already (same lease) keeps its
// place in the queue and proclaims the new value if it differs.
func (s *Election) Campaign(ctx context.Context, req *v3electionpb.CampaignRequest) (*v3electionpb.CampaignResponse, error) {
	resp, err := s.campaign(ctx, req)
	return resp, asEtcd(err)
}

func (s *Election) campaign(ctx context.Context, req *v3electionpb.CampaignRequest) (*v3electionpb.CampaignResponse, error) {
	lease, err := s.r.session(ctx, req.Lease)
	if err != nil {
		return nil, err
	}
	pfx := string(req.Name) + "/"
	key := ownKey(pfx, lease)
	resp, rev, err := s.r.acquire(ctx, pfx, key, string(req.Value), lease)
	if err != nil {
		return nil, err
	}
	leader := &v3electionpb.LeaderKey{Name: req.Name, Key: []byte(key), Rev: rev, Lease: lease}
	if !resp.Succeeded {
		kv := resp.Responses[0].GetResponseRange().GetKvs()[0] // acquire checked it is there
		if string(kv.Value) != string(req.Value) {
			if _, err := s.proclaim(ctx, leader, req.Value); err != nil {
				s.resign(ctx, leader)
				return nil, err
			}
		}
	}
	if _, err := s.r.waitDeletes(ctx, pfx, rev-1); err != nil {
		// etcd's recipe withdraws only a canceled campaign; after another
		// failure the candidate stays queued until its lease ends.
		if ctx.Err() != nil {
			s.resign(ctx, leader)
		}
		return nil, err
	}
	// etcd answers here without looking; a key whose lease ended while it
	// waited would then "win" a leadership nobody holds. Check instead.
	g, err := s.r.b.KV.Range(ctx, &pb.RangeRequest{Key: []byte(key)})
	if err != nil {
		return nil, err
	}
	if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != rev {
		return nil, ErrElectionNotLeader
	}
	return &v3electionpb.CampaignResponse{Header: resp.Header, Leader: leader}, nil
}

// resign withdraws a failed campaign's key.
func (s *Election) resign(ctx context.Context, leader *v3electionpb.LeaderKey) {
	s.r.cleanup(ctx, "campaign", string(leader.Key), func(ctx context.Context) error {
		_, err := s.r.b.KV.Txn(ctx, resignTxn(leader))
		return err
	})
}

// Proclaim sets the leader's value, if req.Leader still leads. A leader
// key without a lease gets a new one of SessionTTL seconds, as in etcd.
func (s *Election) Proclaim(ctx context.Context, req *v3electionpb.ProclaimRequest) (*v3electionpb.ProclaimResponse, error) {
	resp, err := s.proclaimRPC(ctx, req)
	return resp, asEtcd(err)
}

func (s *Election) proclaimRPC(ctx context.Context, req *v3electionpb.ProclaimRequest) (*v3electionpb.ProclaimResponse, error) {
	if req.Leader == nil {
		return nil, ErrMissingLeaderKey
	}
	lease, err := s.r.session(ctx, req.Leader.Lease)
	if err != nil {
		return nil, err
	}
	leader := &v3electionpb.LeaderKey{Name: req.Leader.Name, Key: req.Leader.Key, Rev: req.Leader.Rev, Lease: lease}
	hdr, err := s.proclaim(ctx, leader, req.Value)
	if err != nil {
		return nil, err
	}
	return &v3electionpb.ProclaimResponse{Header: hdr}, nil
}

// proclaim puts value on the leader key if it still has the leader's
// create revision.
func (s *Election) proclaim(ctx context.Context, leader *v3electionpb.LeaderKey, value []byte) (*pb.ResponseHeader, error) {
	resp, err := s.r.b.KV.Txn(ctx, &pb.TxnRequest{
		Compare: []*pb.Compare{createRevIs(string(leader.Key), leader.Rev)},
		Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
			Key: leader.Key, Value: value, Lease: leader.Lease,
		}}}},
	})
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		return nil, ErrElectionNotLeader
	}
	return resp.Header, nil
}

// Resign deletes the leader key if it still has the leader's create
// revision; resigning a leadership already lost succeeds, as in etcd.
func (s *Election) Resign(ctx context.Context, req *v3electionpb.ResignRequest) (*v3electionpb.ResignResponse, error) {
	resp, err := s.resignRPC(ctx, req)
	return resp, asEtcd(err)
}

func (s *Election) resignRPC(ctx context.Context, req *v3electionpb.ResignRequest) (*v3electionpb.ResignResponse, error) {
	if req.Leader == nil {
		return nil, ErrMissingLeaderKey
	}
	resp, err := s.r.b.KV.Txn(ctx, resignTxn(req.Leader))
	if err != nil {
		return nil, err
	}
	return &v3electionpb.ResignResponse{Header: resp.Header}, nil
}

func resignTxn(leader *v3electionpb.LeaderKey) *pb.TxnRequest {
	return &pb.TxnRequest{
		Compare: []*pb.Compare{createRevIs(string(leader.Key), leader.Rev)},
		Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{
			RequestDeleteRange: &pb.DeleteRangeRequest{Key: leader.Key},
		}}},
	}
}

// Leader returns the leader's key and value, or ErrElectionNoLeader.
func (s *Election) Leader(ctx context.Context, req *v3electionpb.LeaderRequest) (*v3electionpb.LeaderResponse, error) {
	resp, err := s.leader(ctx, req)
	return resp, asEtcd(err)
}

func (s *Election) leader(ctx context.Context, req *v3electionpb.LeaderRequest) (*v3electionpb.LeaderResponse, error) {
	resp, err := s.r.b.KV.Range(ctx, firstCreated(string(req.Name)+"/"))
	if err != nil {
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, ErrElectionNoLeader
	}
	return &v3electionpb.LeaderResponse{Header: resp.Header, Kv: resp.Kvs[0]}, nil
}

// Observe streams the leader: the current one (or, if there is none, the
// first to campaign), then each new value it proclaims, then, once its key
// is deleted, the next leader, and so on until the client goes away.
func (s *Election) Observe(req *v3electionpb.LeaderRequest, stream grpc.ServerStreamingServer[v3electionpb.LeaderResponse]) error {
	return asEtcd(s.observe(req, stream))
}

func (s *Election) observe(req *v3electionpb.LeaderRequest, stream grpc.ServerStreamingServer[v3electionpb.LeaderResponse]) error {
	ctx := stream.Context()
	pfx := string(req.Name) + "/"
	for {
		resp, err := s.r.b.KV.Range(ctx, firstCreated(pfx))
		if err != nil {
			return err
		}
		hdr, kv := resp.Header, (*mvccpb.KeyValue)(nil)
		if len(resp.Kvs) > 0 {
			kv = resp.Kvs[0]
		} else if hdr, kv, err = s.firstPut(ctx, pfx, resp.Header); err != nil {
			return err
		} else if kv == nil {
			continue // a revision compaction ended the watch: read again
		}
		if err := stream.Send(&v3electionpb.LeaderResponse{Header: hdr, Kv: kv}); err != nil {
			return err
		}
		if err := s.followLeader(ctx, stream, kv.Key, hdr); err != nil {
			return err
		}
	}
}

// firstPut waits for the first put under pfx after the read whose header
// is hdr, and returns it with a header at its revision; nil if a revision
// compaction ended the watch first.
func (s *Election) firstPut(ctx context.Context, pfx string, hdr *pb.ResponseHeader) (*pb.ResponseHeader, *mvccpb.KeyValue, error) {
	ws, err := s.r.watch([]byte(pfx), prefixEnd(pfx), hdr.Revision)
	if err != nil {
		return nil, nil, err
	}
	defer ws.Close()
	for {
		resp, err := next(ctx, ws)
		if err != nil {
			return nil, nil, err
		}
		if resp.CompactRevision != 0 {
			return nil, nil, nil
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.PUT {
				return withRevision(hdr, ev.Kv.ModRevision), ev.Kv, nil
			}
		}
	}
}

// followLeader sends each new value of the leader key until it is
// deleted (or a revision compaction ends the watch: the caller reads the
// leader again).
func (s *Election) followLeader(ctx context.Context, stream grpc.ServerStreamingServer[v3electionpb.LeaderResponse], key []byte, hdr *pb.ResponseHeader) error {
	ws, err := s.r.watch(key, nil, hdr.Revision+1)
	if err != nil {
		return err
	}
	defer ws.Close()
	for {
		resp, err := next(ctx, ws)
		if err != nil {
			return err
		}
		if resp.CompactRevision != 0 {
			return nil
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.DELETE {
				return nil
			}
			if err := stream.Send(&v3electionpb.LeaderResponse{Header: withRevision(hdr, resp.Header.GetRevision()), Kv: ev.Kv}); err != nil {
				return err
			}
		}
	}
}

// withRevision copies hdr (whose identity fields the KV service filled)
// with another revision: watch responses from the hub carry only theirs.
func withRevision(hdr *pb.ResponseHeader, rev int64) *pb.ResponseHeader {
	return &pb.ResponseHeader{ClusterId: hdr.ClusterId, MemberId: hdr.MemberId, RaftTerm: hdr.RaftTerm, Revision: rev}
}
