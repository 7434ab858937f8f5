// Package membership is the cluster's membership as etcd's Cluster API
// changes it: adding, removing, updating and promoting members with etcd's
// checks (strict reconfiguration: a change must leave a quorum of started
// voters, unless --strict-reconfig-check=false; one learner at most, or
// --max-learners; a learner is promoted only once its log is
// close to the leader's), proposed as raft conf changes and answered once
// applied; moving the leadership; the members a new cluster bootstraps
// with; the attributes a member publishes; and what a member learns from
// its peers rather than its log (the cluster it joins, its own removal).
//
// The member list itself is the applier's (apply.Applier.Members): conf
// changes reach it through raft like every other entry, so this package
// reads it and never writes it. The checks here run before a change is
// proposed; every member checks the change again as it applies
// (memberlist.List.Check), where two changes proposed at once meet in
// order.
package membership

import (
	"context"
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/membershippb"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/membership/memberlist"
	"github.com/strata-kv/strata/server"
	"github.com/strata-kv/strata/tlsconfig"
	"github.com/strata-kv/strata/transport"
)

// learnerReadyFraction is how close a learner's log must be to the
// leader's before it may be promoted (etcd's readyPercentThreshold).
const learnerReadyFraction = 0.9

// healthInterval is how long a peer must have been connected to count as
// connected in the strict reconfiguration check (etcd's HealthInterval):
// a connection a moment old may be about to drop again.
const healthInterval = 5 * time.Second

// Members is the applied member list (apply.Applier).
type Members interface {
	Members() []*pb.Member
}

// Raft is what the service needs of the raft node (node.Node).
type Raft interface {
	Leader() uint64
	// Status is raft's status, with the followers' progress on a leader.
	Status(ctx context.Context) (raft.Status, error)
	TransferLeadership(ctx context.Context, transferee uint64) error
	// WaitLeader returns once there is a leader, or ctx ends.
	WaitLeader(ctx context.Context) error
}

// Proposer proposes conf changes and requests (propose.Proposer).
type Proposer interface {
	ProposeConfChange(ctx context.Context, cc *raftpb.ConfChange) (<-chan apply.Result, func(), error)
	Propose(ctx context.Context, req *pb.InternalRaftRequest) (apply.Result, error)
}

// Activity says whether a peer is connected (transport.Transport).
type Activity interface {
	// ActiveSince is when the connection to the peer became active; zero
	// if it is not.
	ActiveSince(id uint64) time.Time
}

// Config is a Service's collaborators and settings.
type Config struct {
	// MemberID is this member's ID and ClusterID its cluster's; Token is
	// --initial-cluster-token, which new members' IDs are derived from.
	MemberID, ClusterID uint64
	Token               string
	// Timeout bounds one change, from proposal to apply.
	Timeout  time.Duration
	Members  Members
	Raft     Raft
	Proposer Proposer
	// Activity tells which voters are started (strict reconfiguration).
	Activity Activity
	// Peers tells a member that removes itself that it is gone.
	Peers *Peers
	// ClientTLS dials the leader's client URL to forward a promotion.
	ClientTLS tlsconfig.Info
	// MaxLearners bounds the learners in the cluster (--max-learners;
	// 0: etcd's default, 1).
	MaxLearners int
	// NoStrictReconfig turns the strict reconfiguration check off
	// (--strict-reconfig-check=false): checks 2 to 4 below are skipped, as
	// etcd skips them; the learner limit and promotion's readiness stay.
	NoStrictReconfig bool
	Logger           *zap.Logger
}

// Service implements server.Membership and server.LeaderMover.
//
// Its checks are etcd's strict reconfiguration check (--strict-reconfig-check,
// on by default), in etcd's terms:
//
//  1. A member is started once it has published its name (its attributes
//     reached the member list through raft).
//  2. Adding a voter needs a quorum of the larger cluster started, the new
//     member not counted; adding to a cluster of one is allowed (the way
//     a cluster is restored from one member). Otherwise ErrNotEnoughStarted.
//  3. Adding any member, learner included, needs this member connected,
//     for healthInterval, to a quorum of the larger cluster, itself counted
//     and the new member not; a cluster of one is exempt. Otherwise
//     ErrUnhealthy.
//  4. Removing a voter needs a quorum of the remaining voters started
//     (ErrNotEnoughStarted); and, unless the voter removed is not connected
//     (a member that is down is not part of the active quorum), the voters
//     connected for healthInterval, less one, must still be a quorum of the
//     smaller cluster (ErrUnhealthy). Removing a learner is not checked.
//  5. Promoting a learner needs its log within learnerReadyFraction of the
//     leader's (ErrLearnerNotReady), and a quorum of the larger voter set
//     started, the learner counted as started (ErrNotEnoughStarted).
//  6. A strata logger (a member whose published client URLs carry the
//     logger's mark, memberlist.IsLogger) is never promoted: a logger
//     keeps the log and never votes (ErrLoggerNotPromotable, on every
//     member, before any forwarding to the leader).
type Service struct {
	cfg Config
	// now is the clock of the connection checks (time.Now; tests set it).
	now func() time.Time
	// published is closed, once, when this member's attributes are in
	// the applied member list (PublishAttributes).
	published     chan struct{}
	publishedOnce sync.Once
}

var _ server.Membership = (*Service)(nil)

// New returns the membership service.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Service{cfg: cfg, now: time.Now, published: make(chan struct{})}
}

// connectedSince counts the members among ids this member has been
// connected to for healthInterval, itself included (etcd's
// numConnectedSince).
func (s *Service) connectedSince(ids []uint64) int {
	since := s.now().Add(-healthInterval)
	n := 0
	for _, id := range ids {
		if id == s.cfg.MemberID {
			n++
			continue
		}
		if t := s.cfg.Activity.ActiveSince(id); !t.IsZero() && t.Before(since) {
			n++
		}
	}
	return n
}

// startedVoters counts the voters that have published their name, and all
// voters, leaving out except (0: none).
func startedVoters(members []*pb.Member, except uint64) (started, voters int) {
	for _, m := range members {
		if m.IsLearner || m.ID == except {
			continue
		}
		voters++
		if m.Name != "" {
			started++
		}
	}
	return started, voters
}

func quorum(n int) int { return n/2 + 1 }

func voterIDs(members []*pb.Member) []uint64 {
	var ids []uint64
	for _, m := range members {
		if !m.IsLearner {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// AddMember implements server.Membership (checks 2 and 3).
func (s *Service) AddMember(ctx context.Context, peerURLs []string, learner bool) (*pb.Member, []*pb.Member, error) {
	members := s.cfg.Members.Members()
	// etcd's order: the strict reconfiguration check, then what applying
	// the change would refuse (taken URLs, the learner limit).
	started, voters := startedVoters(members, 0)
	strict := !s.cfg.NoStrictReconfig
	if strict && !learner && !(started == 1 && voters == 1) && started < quorum(voters+1) {
		return nil, nil, server.ErrNotEnoughStarted
	}
	if strict && voters > 1 && s.connectedSince(voterIDs(members)) < quorum(voters+1) {
		return nil, nil, server.ErrUnhealthy
	}
	if memberlist.URLsTaken(members, peerURLs, 0) {
		return nil, nil, server.ErrPeerURLExists
	}
	if learner && memberlist.LearnerLimitReached(members, s.cfg.MaxLearners) {
		return nil, nil, server.ErrTooManyLearners
	}
	id := newMemberID(peerURLs, s.cfg.Token, s.now())
	if memberlist.Find(members, id) != nil {
		return nil, nil, server.ErrMemberExists
	}
	rec := &pb.Member{ID: id, PeerURLs: peerURLs, IsLearner: learner}
	typ := raftpb.ConfChangeAddNode
	if learner {
		typ = raftpb.ConfChangeAddLearnerNode
	}
	after, err := s.change(ctx, typ, id, rec)
	if err != nil {
		return nil, nil, err
	}
	return rec, after, nil
}

// RemoveMember implements server.Membership (check 4).
func (s *Service) RemoveMember(ctx context.Context, id uint64) ([]*pb.Member, error) {
	members := s.cfg.Members.Members()
	target := memberlist.Find(members, id)
	if target == nil {
		return nil, server.ErrMemberNotFound
	}
	if !target.IsLearner && !s.cfg.NoStrictReconfig {
		if started, voters := startedVoters(members, id); started < quorum(voters) {
			return nil, server.ErrNotEnoughStarted
		}
		down := id != s.cfg.MemberID && s.cfg.Activity.ActiveSince(id).IsZero()
		all := voterIDs(members)
		if !down && s.connectedSince(all)-1 < quorum(len(all)-1) {
			return nil, server.ErrUnhealthy
		}
	}
	return s.change(ctx, raftpb.ConfChangeRemoveNode, id, nil)
}

// UpdateMember implements server.Membership.
func (s *Service) UpdateMember(ctx context.Context, id uint64, peerURLs []string) ([]*pb.Member, error) {
	members := s.cfg.Members.Members()
	target := memberlist.Find(members, id)
	if target == nil {
		return nil, server.ErrMemberNotFound
	}
	if memberlist.URLsTaken(members, peerURLs, id) {
		return nil, server.ErrPeerURLExists
	}
	rec := proto.CloneOf(target)
	rec.PeerURLs = peerURLs
	return s.change(ctx, raftpb.ConfChangeUpdateNode, id, rec)
}

// PromoteMember implements server.Membership (checks 5 and 6). Only the leader knows how far
// a learner's log is, so a follower forwards the request to it.
func (s *Service) PromoteMember(ctx context.Context, id uint64) ([]*pb.Member, error) {
	members := s.cfg.Members.Members()
	target := memberlist.Find(members, id)
	if target == nil {
		return nil, server.ErrMemberNotFound
	}
	if memberlist.IsLogger(target) {
		return nil, fmt.Errorf("%w: member %x (%s)", server.ErrLoggerNotPromotable, id, target.Name)
	}
	if !target.IsLearner {
		return nil, server.ErrMemberNotLearner
	}
	leader := s.cfg.Raft.Leader()
	if leader != s.cfg.MemberID {
		return s.forwardPromote(ctx, leader, id)
	}
	st, err := s.cfg.Raft.Status(ctx)
	if err != nil {
		return nil, err
	}
	learnerProgress, ok := st.Progress[id]
	leaderProgress := st.Progress[s.cfg.MemberID]
	if !ok || float64(learnerProgress.Match) < float64(leaderProgress.Match)*learnerReadyFraction {
		return nil, server.ErrLearnerNotReady
	}
	if started, voters := startedVoters(members, 0); !s.cfg.NoStrictReconfig && started+1 < quorum(voters+1) {
		return nil, server.ErrNotEnoughStarted
	}
	rec := proto.CloneOf(target)
	rec.IsLearner = false
	return s.change(ctx, raftpb.ConfChangeAddNode, id, rec)
}

func (s *Service) forwardPromote(ctx context.Context, leader, id uint64) ([]*pb.Member, error) {
	lm := memberlist.Find(s.cfg.Members.Members(), leader)
	if lm == nil || len(lm.ClientURLs) == 0 {
		return nil, server.ErrNotLeader
	}
	addr, err := transport.HostPort(lm.ClientURLs[0])
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(s.cfg.ClientTLS.DialCreds(lm.ClientURLs[0], s.cfg.Logger)))
	if err != nil {
		return nil, fmt.Errorf("dial leader %x: %w", leader, err)
	}
	defer conn.Close()
	// The leader checks the caller again: it needs the caller's token.
	resp, err := pb.NewClusterClient(conn).MemberPromote(server.ForwardToken(ctx), &pb.MemberPromoteRequest{ID: id})
	if err != nil {
		return nil, err
	}
	return resp.Members, nil
}

// change proposes one membership change and waits for it to be applied.
func (s *Service) change(ctx context.Context, typ raftpb.ConfChangeType, id uint64, rec *pb.Member) ([]*pb.Member, error) {
	cc := &raftpb.ConfChange{Type: typ.Enum(), NodeId: proto.Uint64(id)}
	if rec != nil {
		raw, err := proto.Marshal(rec)
		if err != nil {
			return nil, err
		}
		cc.Context = raw
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	resc, forget, err := s.cfg.Proposer.ProposeConfChange(ctx, cc)
	if err != nil {
		return nil, err
	}
	// A member removing itself may never apply its removal: the leader
	// stops replicating to it once the removal commits. It then learns the
	// outcome from its peers.
	var removedc <-chan []*pb.Member
	if typ == raftpb.ConfChangeRemoveNode && id == s.cfg.MemberID {
		removedc = s.cfg.Peers.AwaitRemoval(ctx)
	}
	select {
	case res := <-resc:
		if res.Err != nil {
			return nil, res.Err
		}
	case members := <-removedc:
		forget()
		s.cfg.Logger.Info("membership changed", zap.Stringer("type", typ), zap.String("member", fmt.Sprintf("%x", id)))
		return members, nil
	case <-ctx.Done():
		forget()
		return nil, ctx.Err()
	}
	s.cfg.Logger.Info("membership changed", zap.Stringer("type", typ), zap.String("member", fmt.Sprintf("%x", id)))
	return s.cfg.Members.Members(), nil
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
func (s *Service) MoveLeader(ctx context.Context, target uint64) error {
	if s.cfg.Raft.Leader() != s.cfg.MemberID {
		return server.ErrNotLeader
	}
	t := memberlist.Find(s.cfg.Members.Members(), target)
	if t == nil || t.IsLearner {
		return server.ErrBadLeaderTransferee
	}
	if target == s.cfg.MemberID {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	err := s.cfg.Raft.TransferLeadership(ctx, target)
	if err != nil && ctx.Err() != nil {
		return server.ErrTimeoutLeaderTransfer
	}
	return err
}

// LoggerIDs returns the IDs of the strata loggers among members (their
// published client URLs carry the logger's mark): the members a node keeps
// its log for under --logger-retention.
func LoggerIDs(members []*pb.Member) []uint64 {
	var ids []uint64
	for _, m := range members {
		if memberlist.IsLogger(m) {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// BootstrapPeers returns the raft peers of a new cluster from
// --initial-cluster, each carrying its member record as the conf change
// context (the applier stores it). A peer URL under two names is refused,
// as etcd refuses it: raft would take both members, and the applier, which
// checks each addition (memberlist), only the first.
func BootstrapPeers(initialCluster map[string][]string, token string) ([]raft.Peer, error) {
	owner := map[string]string{}
	for name, urls := range initialCluster {
		for _, u := range urls {
			if other, ok := owner[u]; ok && other != name {
				return nil, fmt.Errorf("initial cluster has duplicated url %s (members %s and %s)", u, min(name, other), max(name, other))
			}
			owner[u] = name
		}
	}
	var peers []raft.Peer
	for _, urls := range initialCluster {
		id := datadir.MemberID(urls, token)
		// Every member writes these entries itself, so they must be
		// byte-identical everywhere: only what --initial-cluster says.
		// Names and client URLs are published by each member once it runs.
		rec := &pb.Member{ID: id, PeerURLs: urls}
		ctx, err := proto.Marshal(rec)
		if err != nil {
			return nil, err
		}
		peers = append(peers, raft.Peer{ID: id, Context: ctx})
	}
	sort.Slice(peers, func(i, j int) bool { return peers[i].ID < peers[j].ID })
	return peers, nil
}

// PublishAttributes replicates this member's name and client URLs when
// they differ from what the cluster records, as etcd publishes them at
// start-up. It retries until it succeeds or ctx ends.
func (s *Service) PublishAttributes(ctx context.Context, name string, clientURLs []string) {
	for {
		if err := s.cfg.Raft.WaitLeader(ctx); err != nil {
			return
		}
		current := memberlist.Find(s.cfg.Members.Members(), s.cfg.MemberID)
		if current != nil && current.Name == name && slices.Equal(current.ClientURLs, clientURLs) {
			s.markPublished(name, clientURLs)
			return
		}
		req := &pb.InternalRaftRequest{ClusterMemberAttrSet: &membershippb.ClusterMemberAttrSetRequest{
			Member_ID:        s.cfg.MemberID,
			MemberAttributes: &membershippb.Attributes{Name: name, ClientUrls: clientURLs},
		}}
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		_, err := s.cfg.Proposer.Propose(pctx, req)
		cancel()
		if err == nil {
			s.markPublished(name, clientURLs)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// publishTimeout bounds one attempt to publish the attributes.
const publishTimeout = 5 * time.Second

// markPublished logs etcd's line, which tools wait for, and tells the
// client server that the member may serve (Published).
func (s *Service) markPublished(name string, clientURLs []string) {
	s.cfg.Logger.Info("published local member to cluster through raft",
		zap.String("local-member-id", fmt.Sprintf("%x", s.cfg.MemberID)),
		zap.String("local-member-attributes", fmt.Sprintf("{Name:%s ClientURLs:%v}", name, clientURLs)),
		zap.String("cluster-id", fmt.Sprintf("%x", s.cfg.ClusterID)),
		zap.Duration("publish-timeout", publishTimeout))
	s.publishedOnce.Do(func() { close(s.published) })
}

// Published is closed once this member's name and client URLs are in the
// applied member list: as etcd's, a member serves clients only then.
func (s *Service) Published() <-chan struct{} { return s.published }
