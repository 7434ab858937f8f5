package server

import (
	"context"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/internal/etcdurl"
	"github.com/strata-kv/strata/membership/memberlist"
)

// Membership changes the cluster's members through raft. Each method
// returns once the change is applied locally, with the members after it.
type Membership interface {
	AddMember(ctx context.Context, peerURLs []string, learner bool) (*pb.Member, []*pb.Member, error)
	RemoveMember(ctx context.Context, id uint64) ([]*pb.Member, error)
	UpdateMember(ctx context.Context, id uint64, peerURLs []string) ([]*pb.Member, error)
	PromoteMember(ctx context.Context, id uint64) ([]*pb.Member, error)
}

// Errors a Membership returns, mapped to etcd's. Those a change can also
// meet as it applies are memberlist's.
var (
	ErrMemberExists     = memberlist.ErrIDExists
	ErrPeerURLExists    = memberlist.ErrPeerURLExists
	ErrMemberNotFound   = memberlist.ErrIDNotFound
	ErrMemberNotLearner = memberlist.ErrMemberNotLearner
	ErrLearnerNotReady  = errors.New("membership: learner is not in sync with the leader")
	// ErrLoggerNotPromotable refuses to promote a strata logger: a logger
	// keeps the log and never votes (docs/logger.md).
	ErrLoggerNotPromotable = memberlist.ErrLoggerNotPromotable
	ErrTooManyLearners     = memberlist.ErrTooManyLearners
	ErrNotEnoughStarted    = errors.New("membership: re-configuration would leave too few started members")
	ErrUnhealthy           = errors.New("membership: this member is not connected to a quorum of the cluster")
	ErrBadLeaderTransferee = errors.New("membership: bad leader transferee")
	// ErrTimeoutLeaderTransfer is etcd's answer when the transferee did
	// not take over in time; etcd has no gRPC error of its own for it and
	// answers codes.Unknown with this text.
	ErrTimeoutLeaderTransfer = errors.New("etcdserver: request timed out, leader transfer took too long")
	ErrNotLeader             = errors.New("membership: not leader")
	ErrMembershipUnavailable = errors.New("membership: changes are not supported by this member")
)

// errGRPCLoggerNotPromotable is ErrLoggerNotPromotable in etcd's terms: a
// failed precondition, as promoting a member that is not a learner is
// (rpctypes.ErrGRPCMemberNotLearner), in etcd's wording.
var errGRPCLoggerNotPromotable = status.Error(codes.FailedPrecondition,
	"etcdserver: can not promote a strata logger member (a logger keeps the log and never votes)")

// Cluster implements etcd's Cluster service.
type Cluster struct {
	pb.UnimplementedClusterServer
	b Backend
	m Membership
}

// NewCluster returns the Cluster service over b; m may be nil, in which
// case changes answer Unimplemented.
func NewCluster(b Backend, m Membership) *Cluster { return &Cluster{b: b, m: m} }

// MemberAdd adds a member, as a learner if asked.
func (c *Cluster) MemberAdd(ctx context.Context, r *pb.MemberAddRequest) (*pb.MemberAddResponse, error) {
	if c.m == nil {
		return c.UnimplementedClusterServer.MemberAdd(ctx, r)
	}
	// etcd's rules, and its form: spaces trimmed, sorted.
	urls, err := etcdurl.Normalize(r.PeerURLs)
	if err != nil {
		return nil, rpctypes.ErrGRPCMemberBadURLs
	}
	m, members, err := c.m.AddMember(ctx, urls, r.IsLearner)
	if err != nil {
		return nil, membershipError(err)
	}
	resp := &pb.MemberAddResponse{Member: m, Members: members}
	fillHeader(c.b, &resp.Header, c.b.Store().Rev())
	return resp, nil
}

// MemberRemove removes a member.
func (c *Cluster) MemberRemove(ctx context.Context, r *pb.MemberRemoveRequest) (*pb.MemberRemoveResponse, error) {
	if c.m == nil {
		return c.UnimplementedClusterServer.MemberRemove(ctx, r)
	}
	members, err := c.m.RemoveMember(ctx, r.ID)
	if err != nil {
		return nil, membershipError(err)
	}
	resp := &pb.MemberRemoveResponse{Members: members}
	fillHeader(c.b, &resp.Header, c.b.Store().Rev())
	return resp, nil
}

// MemberUpdate changes a member's peer URLs.
func (c *Cluster) MemberUpdate(ctx context.Context, r *pb.MemberUpdateRequest) (*pb.MemberUpdateResponse, error) {
	if c.m == nil {
		return c.UnimplementedClusterServer.MemberUpdate(ctx, r)
	}
	urls, err := etcdurl.Normalize(r.PeerURLs)
	if err != nil {
		return nil, rpctypes.ErrGRPCMemberBadURLs
	}
	members, err := c.m.UpdateMember(ctx, r.ID, urls)
	if err != nil {
		return nil, membershipError(err)
	}
	resp := &pb.MemberUpdateResponse{Members: members}
	fillHeader(c.b, &resp.Header, c.b.Store().Rev())
	return resp, nil
}

// MemberPromote makes a caught-up learner a voter.
func (c *Cluster) MemberPromote(ctx context.Context, r *pb.MemberPromoteRequest) (*pb.MemberPromoteResponse, error) {
	if c.m == nil {
		return c.UnimplementedClusterServer.MemberPromote(ctx, r)
	}
	members, err := c.m.PromoteMember(ctx, r.ID)
	if err != nil {
		return nil, membershipError(err)
	}
	resp := &pb.MemberPromoteResponse{Members: members}
	fillHeader(c.b, &resp.Header, c.b.Store().Rev())
	return resp, nil
}

// MemberList lists the cluster's members; a linearizable request first
// waits for a ReadIndex barrier.
func (c *Cluster) MemberList(ctx context.Context, r *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	if r.Linearizable {
		if err := c.b.ReadBarrier(ctx); err != nil {
			return nil, toGRPCError(err)
		}
	}
	resp := &pb.MemberListResponse{Members: c.b.Members()}
	fillHeader(c.b, &resp.Header, c.b.Store().Rev())
	return resp, nil
}

func membershipError(err error) error {
	switch {
	case errors.Is(err, ErrMemberExists):
		return rpctypes.ErrGRPCMemberExist
	case errors.Is(err, ErrPeerURLExists):
		return rpctypes.ErrGRPCPeerURLExist
	case errors.Is(err, ErrMemberNotFound), errors.Is(err, memberlist.ErrIDRemoved):
		// etcd answers a change of a removed ID as it answers one of an
		// unknown ID.
		return rpctypes.ErrGRPCMemberNotFound
	case errors.Is(err, ErrMemberNotLearner):
		return rpctypes.ErrGRPCMemberNotLearner
	case errors.Is(err, ErrLearnerNotReady):
		return rpctypes.ErrGRPCLearnerNotReady
	case errors.Is(err, ErrLoggerNotPromotable):
		return errGRPCLoggerNotPromotable
	case errors.Is(err, ErrTooManyLearners):
		return rpctypes.ErrGRPCTooManyLearners
	case errors.Is(err, ErrNotEnoughStarted):
		return rpctypes.ErrGRPCMemberNotEnoughStarted
	case errors.Is(err, ErrUnhealthy):
		return rpctypes.ErrGRPCUnhealthy
	case errors.Is(err, ErrBadLeaderTransferee):
		return rpctypes.ErrGRPCBadLeaderTransferee
	case errors.Is(err, ErrTimeoutLeaderTransfer):
		return status.Error(codes.Unknown, ErrTimeoutLeaderTransfer.Error())
	case errors.Is(err, ErrNotLeader):
		return rpctypes.ErrGRPCNotLeader
	}
	return toGRPCError(err)
}
