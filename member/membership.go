package member

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/server"
	"github.com/strata-kv/strata/transport"
)

// maxLearners is etcd's limit on learners in a cluster.
const maxLearners = 1

// learnerReadyFraction is how close a learner's log must be to the
// leader's before it may be promoted (etcd's readyPercentThreshold).
const learnerReadyFraction = 0.9

// membership implements server.Membership for a Member: it checks a change
// against the current members and the peers this member can reach (etcd's
// strict reconfiguration check), then proposes it as a raft conf change and
// waits until it is applied.
type membership struct{ m *Member }

var _ server.Membership = membership{}

func (ms membership) members() []*pb.Member { return ms.m.applier.Members() }

func find(members []*pb.Member, id uint64) *pb.Member {
	for _, m := range members {
		if m.ID == id {
			return m
		}
	}
	return nil
}

func urlsTaken(members []*pb.Member, urls []string, except uint64) bool {
	for _, m := range members {
		if m.ID == except {
			continue
		}
		for _, have := range m.PeerURLs {
			for _, want := range urls {
				if have == want {
					return true
				}
			}
		}
	}
	return false
}

// activeVoters counts the voters among ids this member is connected to,
// itself included.
func (ms membership) activeVoters(ids []uint64) int {
	n := 0
	for _, id := range ids {
		if id == ms.m.memberID || (ms.m.transport != nil && !ms.m.transport.ActiveSince(id).IsZero()) {
			n++
		}
	}
	return n
}

func voterIDs(members []*pb.Member) []uint64 {
	var ids []uint64
	for _, m := range members {
		if !m.IsLearner {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// AddMember implements server.Membership.
func (ms membership) AddMember(ctx context.Context, peerURLs []string, learner bool) (*pb.Member, []*pb.Member, error) {
	members := ms.members()
	if urlsTaken(members, peerURLs, 0) {
		return nil, nil, server.ErrPeerURLExists
	}
	if learner {
		n := 0
		for _, m := range members {
			if m.IsLearner {
				n++
			}
		}
		if n >= maxLearners {
			return nil, nil, server.ErrTooManyLearners
		}
	} else {
		// The new voter is not started yet: the members that are must
		// still form a quorum of the larger cluster.
		voters := voterIDs(members)
		if ms.activeVoters(voters) < (len(voters)+1)/2+1 {
			return nil, nil, server.ErrNotEnoughStarted
		}
	}
	id := newMemberID(peerURLs, ms.m.cfg.InitialClusterToken, time.Now())
	if find(members, id) != nil {
		return nil, nil, server.ErrMemberExists
	}
	rec := &pb.Member{ID: id, PeerURLs: peerURLs, IsLearner: learner}
	typ := raftpb.ConfChangeAddNode
	if learner {
		typ = raftpb.ConfChangeAddLearnerNode
	}
	after, err := ms.change(ctx, typ, id, rec)
	if err != nil {
		return nil, nil, err
	}
	return rec, after, nil
}

// RemoveMember implements server.Membership.
func (ms membership) RemoveMember(ctx context.Context, id uint64) ([]*pb.Member, error) {
	members := ms.members()
	target := find(members, id)
	if target == nil {
		return nil, server.ErrMemberNotFound
	}
	if !target.IsLearner {
		var rest []uint64
		for _, v := range voterIDs(members) {
			if v != id {
				rest = append(rest, v)
			}
		}
		if ms.activeVoters(rest) < len(rest)/2+1 {
			return nil, server.ErrNotEnoughStarted
		}
	}
	return ms.change(ctx, raftpb.ConfChangeRemoveNode, id, nil)
}

// UpdateMember implements server.Membership.
func (ms membership) UpdateMember(ctx context.Context, id uint64, peerURLs []string) ([]*pb.Member, error) {
	members := ms.members()
	target := find(members, id)
	if target == nil {
		return nil, server.ErrMemberNotFound
	}
	if urlsTaken(members, peerURLs, id) {
		return nil, server.ErrPeerURLExists
	}
	rec := proto.CloneOf(target)
	rec.PeerURLs = peerURLs
	return ms.change(ctx, raftpb.ConfChangeUpdateNode, id, rec)
}

// PromoteMember implements server.Membership. Only the leader knows how far
// a learner's log is, so a follower forwards the request to it.
func (ms membership) PromoteMember(ctx context.Context, id uint64) ([]*pb.Member, error) {
	members := ms.members()
	target := find(members, id)
	if target == nil {
		return nil, server.ErrMemberNotFound
	}
	if !target.IsLearner {
		return nil, server.ErrMemberNotLearner
	}
	leader := ms.m.node.Leader()
	if leader != ms.m.memberID {
		return ms.forwardPromote(ctx, leader, id)
	}
	st, err := ms.m.node.Status(ctx)
	if err != nil {
		return nil, err
	}
	learnerProgress, ok := st.Progress[id]
	leaderProgress := st.Progress[ms.m.memberID]
	if !ok || float64(learnerProgress.Match) < float64(leaderProgress.Match)*learnerReadyFraction {
		return nil, server.ErrLearnerNotReady
	}
	rec := proto.CloneOf(target)
	rec.IsLearner = false
	return ms.change(ctx, raftpb.ConfChangeAddNode, id, rec)
}

func (ms membership) forwardPromote(ctx context.Context, leader, id uint64) ([]*pb.Member, error) {
	lm := find(ms.members(), leader)
	if lm == nil || len(lm.ClientURLs) == 0 {
		return nil, server.ErrNotLeader
	}
	addr, err := transport.HostPort(lm.ClientURLs[0])
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(ms.m.cfg.TLS.Client.DialCreds(lm.ClientURLs[0], ms.m.logger)))
	if err != nil {
		return nil, fmt.Errorf("dial leader %x: %w", leader, err)
	}
	defer conn.Close()
	resp, err := pb.NewClusterClient(conn).MemberPromote(ctx, &pb.MemberPromoteRequest{ID: id})
	if err != nil {
		return nil, err
	}
	return resp.Members, nil
}

// change proposes one membership change and waits for it to be applied.
func (ms membership) change(ctx context.Context, typ raftpb.ConfChangeType, id uint64, rec *pb.Member) ([]*pb.Member, error) {
	cc := &raftpb.ConfChange{Type: typ.Enum(), NodeId: proto.Uint64(id)}
	if rec != nil {
		raw, err := proto.Marshal(rec)
		if err != nil {
			return nil, err
		}
		cc.Context = raw
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second+2*ms.m.cfg.ElectionTimeout)
	defer cancel()
	resc, forget, err := ms.m.proposer.ProposeConfChange(ctx, cc)
	if err != nil {
		return nil, err
	}
	// A member removing itself may never apply its removal: the leader
	// stops replicating to it once the removal commits. It then learns the
	// outcome from its peers.
	var removedc <-chan []*pb.Member
	if typ == raftpb.ConfChangeRemoveNode && id == ms.m.memberID {
		removedc = ms.m.awaitOwnRemoval(ctx)
	}
	select {
	case res := <-resc:
		if res.Err != nil {
			return nil, res.Err
		}
	case members := <-removedc:
		forget()
		ms.m.logger.Info("membership changed", zap.Stringer("type", typ), zap.String("member", fmt.Sprintf("%x", id)))
		return members, nil
	case <-ctx.Done():
		forget()
		return nil, ctx.Err()
	}
	ms.m.logger.Info("membership changed", zap.Stringer("type", typ), zap.String("member", fmt.Sprintf("%x", id)))
	return ms.members(), nil
}

// newMemberID gives a member added at run time an ID from its peer URLs,
// the cluster token and the time, as etcd does, so that a member removed
// and added again with the same URLs gets a new ID.
func newMemberID(peerURLs []string, token string, now time.Time) uint64 {
	urls := append([]string(nil), peerURLs...)
	sort.Strings(urls)
	b := []byte(strings.Join(urls, "") + token)
	b = binary.BigEndian.AppendUint64(b, uint64(now.UnixNano()))
	sum := sha1.Sum(b)
	return binary.BigEndian.Uint64(sum[:8])
}

// MoveLeader implements server.LeaderMover with etcd's checks: only the
// leader moves leadership, and only to a voting member.
func (m *Member) MoveLeader(ctx context.Context, target uint64) error {
	if m.node.Leader() != m.memberID {
		return server.ErrNotLeader
	}
	t := find(m.applier.Members(), target)
	if t == nil || t.IsLearner {
		return server.ErrBadLeaderTransferee
	}
	if target == m.memberID {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second+2*m.cfg.ElectionTimeout)
	defer cancel()
	return m.node.TransferLeadership(ctx, target)
}
