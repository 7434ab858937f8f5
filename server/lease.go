package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/tlsconfig"
)

// forwardedKey marks a lease request a follower forwarded to the leader:
// a member that receives one and is not the leader refuses it instead of
// forwarding it again, so that a stale view of the leader cannot make a
// request go round in circles.
const forwardedKey = "strata-lease-forwarded"

// primaryWait bounds how long the leader waits for its lessor to be
// promoted (the lessor notices leadership on its next tick).
const primaryWait = 2 * time.Second

// Lease implements etcd's Lease service. Grant and Revoke go through
// raft from any member. KeepAlive and TimeToLive need the deadlines only
// the leader keeps: a follower forwards them to the leader's peer URL
// (served there by RegisterPeer), as etcd forwards them to its leader's
// peer URLs: the peers reach each other there whatever the client URLs
// advertise (a 127.0.0.1 client URL, a client port that wants client
// certificates the member does not hold). Leases answers from the local
// lessor, as etcd's does.
//
// Concurrency: handlers run on many goroutines; Close once, after the gRPC
// server stopped.
type Lease struct {
	pb.UnimplementedLeaseServer
	kv *KV
	b  Backend
	l  *lease.Lessor

	idSeq atomic.Uint64
	// peerTLS dials a leader's https peer URL (the --peer-* files).
	peerTLS tlsconfig.Info
	logger  *zap.Logger

	mu struct {
		sync.Mutex
		conns  map[string]*grpc.ClientConn // peer URL -> connection
		closed bool
	}
}

// NewLease returns the Lease service over b and its lessor l. peerTLS
// dials the leader's peer URL, to forward keep-alives and TTL questions
// there.
func NewLease(b Backend, l *lease.Lessor, limits Limits, peerTLS tlsconfig.Info, logger *zap.Logger) *Lease {
	if logger == nil {
		logger = zap.NewNop()
	}
	s := &Lease{kv: NewKV(b, limits), b: b, l: l, peerTLS: peerTLS, logger: logger}
	s.mu.conns = map[string]*grpc.ClientConn{}
	return s
}

// Close closes the connections used to forward requests to the leader.
func (s *Lease) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.closed = true
	var errs []error
	for _, c := range s.mu.conns {
		errs = append(errs, c.Close())
	}
	s.mu.conns = nil
	return errors.Join(errs...)
}

// LeaseGrant creates a lease. An ID of 0 asks the server to choose one.
func (s *Lease) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	if r.TTL > lease.MaxLeaseTTL {
		return nil, rpctypes.ErrGRPCLeaseTTLTooLarge
	}
	req := &pb.LeaseGrantRequest{TTL: r.TTL, ID: r.ID}
	if req.ID == 0 {
		req.ID = s.nextID()
	}
	res, err := s.kv.propose(ctx, &pb.InternalRaftRequest{LeaseGrant: req})
	if err != nil {
		return nil, leaseError(err)
	}
	resp := res.Response.(*pb.LeaseGrantResponse)
	fillHeader(s.b, &resp.Header, 0)
	return resp, nil
}

// nextID returns a lease ID unique across members and restarts, built as
// etcd builds its: the member ID's low 16 bits, the start time in
// milliseconds, a counter; the sign bit cleared.
func (s *Lease) nextID() int64 {
	if s.idSeq.Load() == 0 {
		prefix := (s.b.MemberID() & 0xffff) << 48
		start := (uint64(time.Now().UnixMilli()) & (1<<40 - 1)) << 8
		s.idSeq.CompareAndSwap(0, prefix|start)
	}
	return int64(s.idSeq.Add(1) & (1<<63 - 1))
}

// LeaseRevoke deletes a lease and, in one revision, its keys.
func (s *Lease) LeaseRevoke(ctx context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	res, err := s.kv.propose(ctx, &pb.InternalRaftRequest{LeaseRevoke: &pb.LeaseRevokeRequest{ID: r.ID}})
	if err != nil {
		return nil, leaseError(err)
	}
	resp := res.Response.(*pb.LeaseRevokeResponse)
	fillHeader(s.b, &resp.Header, 0)
	return resp, nil
}

// LeaseKeepAlive renews leases for as long as the client streams requests.
// A lease that does not exist (or has just expired) is answered with TTL 0,
// as etcd answers it; clientv3 then ends its keepalive.
func (s *Lease) LeaseKeepAlive(stream grpc.BidiStreamingServer[pb.LeaseKeepAliveRequest, pb.LeaseKeepAliveResponse]) error {
	ctx := stream.Context()
	var fwd *keepAliveForward
	defer func() { fwd.close() }()
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp, err := s.keepAliveOne(ctx, req, &fwd)
		if err != nil {
			return err
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// keepAliveForward is one follower's stream to the leader, carrying the
// keepalives of one client stream.
type keepAliveForward struct {
	leader uint64
	stream grpc.BidiStreamingClient[pb.LeaseKeepAliveRequest, pb.LeaseKeepAliveResponse]
	cancel context.CancelFunc
}

func (f *keepAliveForward) close() {
	if f != nil {
		f.cancel()
	}
}

func (s *Lease) keepAliveOne(ctx context.Context, req *pb.LeaseKeepAliveRequest, fwd **keepAliveForward) (*pb.LeaseKeepAliveResponse, error) {
	local, err := s.local(ctx)
	if err != nil {
		return nil, err
	}
	if local {
		ttl, err := s.l.Renew(ctx, req.ID)
		if errors.Is(err, lease.ErrLeaseNotFound) {
			// The grant may be committed and answered by another member
			// while this leader has yet to apply it: wait for what is
			// committed and try once more before answering TTL 0, which
			// clientv3 takes for an expired lease (etcd #13675: its leader
			// waits for its applied index before a renewal).
			if berr := s.kv.barrier(ctx); berr == nil {
				ttl, err = s.l.Renew(ctx, req.ID)
			}
		}
		if err != nil && !errors.Is(err, lease.ErrLeaseNotFound) {
			return nil, leaseError(err)
		}
		resp := &pb.LeaseKeepAliveResponse{ID: req.ID, TTL: ttl}
		fillHeader(s.b, &resp.Header, s.b.Store().Rev())
		return resp, nil
	}
	leader := s.b.Leader()
	if *fwd != nil && (*fwd).leader != leader {
		(*fwd).close()
		*fwd = nil
	}
	if *fwd == nil {
		client, err := s.leaderClient(leader)
		if err != nil {
			return nil, err
		}
		fctx, cancel := context.WithCancel(forwardContext(ctx))
		stream, err := client.LeaseKeepAlive(fctx)
		if err != nil {
			cancel()
			return nil, rpctypes.ErrGRPCNoLeader
		}
		*fwd = &keepAliveForward{leader: leader, stream: stream, cancel: cancel}
	}
	f := *fwd
	if err := f.stream.Send(req); err != nil {
		f.close()
		*fwd = nil
		return nil, rpctypes.ErrGRPCNoLeader
	}
	// A leader that stops answering (paused, cut off) would hold the
	// stream until its connection fails, minutes later: the answer is
	// awaited for the request timeout at most, as etcd bounds a forwarded
	// renewal, and the client then retries, against the new leader.
	expired := time.AfterFunc(s.kv.limits.RequestTimeout, f.cancel)
	resp, err := f.stream.Recv()
	if !expired.Stop() {
		f.close()
		*fwd = nil
		return nil, rpctypes.ErrGRPCTimeout
	}
	if err != nil {
		f.close()
		*fwd = nil
		return nil, forwardError(err)
	}
	return resp, nil
}

// LeaseTimeToLive reports a lease's remaining and granted TTL and, if
// asked, its keys. A lease that does not exist is answered with TTL -1, as
// etcd answers it.
func (s *Lease) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	local, err := s.local(ctx)
	if err != nil {
		return nil, err
	}
	if !local {
		client, err := s.leaderClient(s.b.Leader())
		if err != nil {
			return nil, err
		}
		fctx, cancel := context.WithTimeout(forwardContext(ctx), s.kv.limits.RequestTimeout)
		defer cancel()
		resp, err := client.LeaseTimeToLive(fctx, r)
		if err != nil {
			if fctx.Err() != nil && ctx.Err() == nil {
				return nil, rpctypes.ErrGRPCTimeout // the leader did not answer in time
			}
			return nil, forwardError(err)
		}
		return resp, nil
	}
	// Answer after every committed grant and revoke is applied, as etcd
	// waits for its applied index.
	if err := s.kv.barrier(ctx); err != nil {
		return nil, err
	}
	remaining, granted, err := s.l.TimeToLive(r.ID)
	resp := &pb.LeaseTimeToLiveResponse{ID: r.ID, TTL: remaining, GrantedTTL: granted}
	switch {
	case errors.Is(err, lease.ErrLeaseNotFound):
		resp = &pb.LeaseTimeToLiveResponse{ID: r.ID, TTL: -1}
	case err != nil:
		return nil, leaseError(err)
	case r.Keys:
		keys, err := s.b.Store().LeaseKeys(r.ID)
		if err != nil {
			return nil, fmt.Errorf("keys of lease %x: %w", r.ID, err)
		}
		resp.Keys = keys
	}
	fillHeader(s.b, &resp.Header, s.b.Store().Rev())
	return resp, nil
}

// LeaseLeases lists every lease this member knows.
func (s *Lease) LeaseLeases(ctx context.Context, _ *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	ids := s.l.Leases()
	resp := &pb.LeaseLeasesResponse{Leases: make([]*pb.LeaseStatus, len(ids))}
	for i, id := range ids {
		resp.Leases[i] = &pb.LeaseStatus{ID: id}
	}
	fillHeader(s.b, &resp.Header, s.b.Store().Rev())
	return resp, nil
}

// local reports whether this member answers a keepalive or TimeToLive
// itself: it is the leader, with its lessor promoted. A request already
// forwarded once that reaches a member that is not the leader is refused
// with "no leader", which clients retry.
func (s *Lease) local(ctx context.Context) (bool, error) {
	self := s.b.MemberID()
	if s.b.Leader() != self {
		if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get(forwardedKey)) > 0 {
			return false, rpctypes.ErrGRPCNoLeader
		}
		return false, nil
	}
	if s.l.Primary() {
		return true, nil
	}
	// Just elected: the lessor is promoted on its next tick.
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	deadline := time.After(primaryWait)
	for !s.l.Primary() {
		select {
		case <-t.C:
		case <-deadline:
			return false, rpctypes.ErrGRPCNoLeader
		case <-ctx.Done():
			return false, toGRPCError(ctx.Err())
		}
		if s.b.Leader() != self {
			return false, nil
		}
	}
	return true, nil
}

// leaderClient returns a Lease client on the leader's first peer URL
// (the one its peers' transports dial first).
func (s *Lease) leaderClient(leader uint64) (pb.LeaseClient, error) {
	if leader == 0 {
		return nil, rpctypes.ErrGRPCNoLeader
	}
	var peerURL, host string
	for _, m := range s.b.Members() {
		if m.ID == leader && len(m.PeerURLs) > 0 {
			u, err := url.Parse(m.PeerURLs[0])
			if err != nil || u.Host == "" {
				return nil, rpctypes.ErrGRPCNoLeader
			}
			peerURL, host = m.PeerURLs[0], u.Host
		}
	}
	if peerURL == "" {
		return nil, rpctypes.ErrGRPCNoLeader // not in this member's list yet
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil, rpctypes.ErrGRPCStopped
	}
	conn, ok := s.mu.conns[peerURL]
	if !ok {
		var err error
		conn, err = grpc.NewClient(host, grpc.WithTransportCredentials(s.peerTLS.DialCreds(peerURL, s.logger)))
		if err != nil {
			return nil, fmt.Errorf("connect to leader %x at %s: %w", leader, peerURL, err)
		}
		s.mu.conns[peerURL] = conn
	}
	return pb.NewLeaseClient(conn), nil
}

// peerLease is the Lease service as the peer URLs serve it, to followers
// forwarding their clients' requests: KeepAlive and TimeToLive, answered
// only by the leader (a member that is not refuses, rather than forward
// again), and Unimplemented for the rest. The follower checked its
// client's permissions before forwarding, as etcd's does; the peer URLs
// are the members' own, guarded by the peer TLS files.
type peerLease struct {
	pb.UnimplementedLeaseServer
	l *Lease
}

// LeaseKeepAlive renews leases on the leader.
func (p peerLease) LeaseKeepAlive(stream grpc.BidiStreamingServer[pb.LeaseKeepAliveRequest, pb.LeaseKeepAliveResponse]) error {
	if p.l.b.Leader() != p.l.b.MemberID() {
		return rpctypes.ErrGRPCNoLeader
	}
	return p.l.LeaseKeepAlive(stream)
}

// LeaseTimeToLive answers on the leader.
func (p peerLease) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	if p.l.b.Leader() != p.l.b.MemberID() {
		return nil, rpctypes.ErrGRPCNoLeader
	}
	return p.l.LeaseTimeToLive(ctx, r)
}

func forwardContext(ctx context.Context) context.Context {
	ctx = ForwardToken(ctx) // the leader checks the caller too (server/auth.go)
	return metadata.AppendToOutgoingContext(ctx, forwardedKey, "1")
}

// forwardError passes on the leader's etcd errors; a broken connection to
// the leader becomes "no leader", which clients retry.
func forwardError(err error) error {
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded, codes.Unknown, codes.Internal:
		return rpctypes.ErrGRPCNoLeader
	}
	return err
}

// leaseError maps the lessor's errors to etcd's gRPC errors.
func leaseError(err error) error {
	switch {
	case errors.Is(err, lease.ErrLeaseExists):
		return rpctypes.ErrGRPCLeaseExist
	case errors.Is(err, lease.ErrLeaseTTLTooLarge):
		return rpctypes.ErrGRPCLeaseTTLTooLarge
	case errors.Is(err, lease.ErrNotPrimary):
		return rpctypes.ErrGRPCNoLeader
	}
	return toGRPCError(err)
}
