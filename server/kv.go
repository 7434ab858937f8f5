// Package server implements etcd's v3 gRPC services on top of a strata
// member: it validates requests as etcd does, sends writes through raft,
// serves reads from the local store (after a ReadIndex barrier unless the
// read is serializable), fills response headers, and maps errors to etcd's
// gRPC codes and messages (go.etcd.io/etcd/api/v3/v3rpc/rpctypes). It holds
// no storage logic of its own.
//
// Concurrency: every handler may run on many goroutines at once; the
// Backend it is given must allow that.
package server

import (
	"cmp"
	"context"
	"errors"
	"math"
	"runtime"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/node"
)

// Backend is what the services need from the member they serve.
type Backend interface {
	// Propose replicates req through raft and returns its applied result.
	Propose(ctx context.Context, req *pb.InternalRaftRequest) (apply.Result, error)
	// ReadBarrier returns once the local store reflects every write
	// committed before the call (raft ReadIndex, then wait for apply).
	ReadBarrier(ctx context.Context) error
	// Store is the local state machine, for reads.
	Store() *mvcc.Store
	// ClusterID, MemberID and Term fill response headers.
	ClusterID() uint64
	MemberID() uint64
	Term() uint64
	// Leader returns the leader's member ID, 0 if none is known.
	Leader() uint64
	// Members lists the cluster's members.
	Members() []*pb.Member
	// Status reports the member's progress for Maintenance.Status.
	Status() Status
}

// Status is the member's state reported by Maintenance.Status.
type Status struct {
	CommitIndex  uint64
	AppliedIndex uint64
	DBSize       int64
	IsLearner    bool
}

// Limits are the request limits etcd enforces.
type Limits struct {
	// MaxRequestBytes bounds a request's encoded size (--max-request-bytes).
	MaxRequestBytes int
	// MaxTxnOps bounds the operations of each txn branch (--max-txn-ops).
	MaxTxnOps int
	// RequestTimeout bounds how long a request waits for raft.
	RequestTimeout time.Duration
	// MaxConcurrentStreams bounds the streams of one client connection
	// (--max-concurrent-streams; 0: etcd's default, math.MaxUint32).
	MaxConcurrentStreams uint32
	// KeepAliveMinTime is the shortest interval between a client's pings
	// the server tolerates (--grpc-keepalive-min-time; 0: gRPC's default).
	// KeepAliveInterval and KeepAliveTimeout make the server ping an idle
	// connection and close it when the ping goes unanswered
	// (--grpc-keepalive-interval, --grpc-keepalive-timeout; either 0: no
	// pings), as etcd sets them.
	KeepAliveMinTime  time.Duration
	KeepAliveInterval time.Duration
	KeepAliveTimeout  time.Duration
}

// grpcOverheadBytes is the slack etcd allows above --max-request-bytes at
// the gRPC layer, so that a request just over the limit gets etcd's "request
// is too large" rather than gRPC's own refusal.
const grpcOverheadBytes = 512 * 1024

// ServerOptions returns the gRPC server options that match etcd's limits.
// Streams are served on a pool of GOMAXPROCS long-lived goroutines (grpc
// starts a goroutine of its own when all are busy): a goroutine per
// request grows its stack anew by copying each time, which took 16-22% of
// the CPU on reads (docs/bench/profile.md; about 10% less server CPU per
// read with the pool).
func (l Limits) ServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(l.MaxRequestBytes + grpcOverheadBytes),
		grpc.MaxSendMsgSize(1<<31 - 1),
		grpc.MaxConcurrentStreams(cmp.Or(l.MaxConcurrentStreams, math.MaxUint32)),
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
	}
	if l.KeepAliveMinTime > 0 {
		opts = append(opts, grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.KeepAliveMinTime}))
	}
	if l.KeepAliveInterval > 0 && l.KeepAliveTimeout > 0 {
		opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{Time: l.KeepAliveInterval, Timeout: l.KeepAliveTimeout}))
	}
	return opts
}

// KV implements etcd's KV service.
type KV struct {
	pb.UnimplementedKVServer
	b      Backend
	limits Limits
}

// NewKV returns the KV service over b.
func NewKV(b Backend, limits Limits) *KV { return &KV{b: b, limits: limits} }

func fillHeader(b Backend, h **pb.ResponseHeader, rev int64) {
	if *h == nil {
		*h = &pb.ResponseHeader{}
	}
	(*h).ClusterId = b.ClusterID()
	(*h).MemberId = b.MemberID()
	(*h).RaftTerm = b.Term()
	if (*h).Revision == 0 {
		(*h).Revision = rev
	}
}

// Range reads keys, linearizably unless the request is serializable.
// (The gRPC service answers plain ranges with rangeWire: rangewire.go.)
func (s *KV) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	if err := s.beforeRange(ctx, r); err != nil {
		return nil, err
	}
	return s.readRange(r)
}

// beforeRange validates r and, unless it is serializable, waits for the
// read barrier.
func (s *KV) beforeRange(ctx context.Context, r *pb.RangeRequest) error {
	if err := checkRange(r); err != nil {
		return err
	}
	if !r.Serializable && !barrierDone(ctx) {
		return s.barrier(ctx)
	}
	return nil
}

// readRange answers r from the store.
func (s *KV) readRange(r *pb.RangeRequest) (*pb.RangeResponse, error) {
	resp, err := s.b.Store().Range(r)
	if err != nil {
		return nil, toGRPCError(err)
	}
	fillHeader(s.b, &resp.Header, s.b.Store().Rev())
	return resp, nil
}

// RangeStream answers a range in chunks, as etcd 3.7's does (what
// Kubernetes' LIST uses for large ranges): the keys in disjoint chunks of
// about --max-request-bytes each, read from one consistent view, and the
// header, more and count on the final chunk. Custom sort orders and
// revision filters are refused with etcd's Unimplemented errors.
func (s *KV) RangeStream(r *pb.RangeRequest, stream grpc.ServerStreamingServer[pb.RangeStreamResponse]) error {
	if err := checkRange(r); err != nil {
		return err
	}
	if r.SortOrder != pb.RangeRequest_NONE && (r.SortTarget != pb.RangeRequest_KEY || r.SortOrder != pb.RangeRequest_ASCEND) {
		return status.Error(codes.Unimplemented, "RangeStream does not support custom sort orders")
	}
	if r.MinModRevision != 0 || r.MaxModRevision != 0 || r.MinCreateRevision != 0 || r.MaxCreateRevision != 0 {
		return status.Error(codes.Unimplemented, "RangeStream does not support revision filters")
	}
	if !r.Serializable && !barrierDone(stream.Context()) {
		if err := s.barrier(stream.Context()); err != nil {
			return err
		}
	}
	// Keys and values at the current revision: their stored bytes, in
	// pooled chunks (rangewire.go).
	ok, err := s.b.Store().RangeStreamEncoded(r, rangeBuffers, s.limits.MaxRequestBytes, func(enc *mvcc.EncodedRange, final bool) error {
		var h *pb.ResponseHeader
		if final {
			h = &pb.ResponseHeader{Revision: enc.Revision}
			fillHeader(s.b, &h, enc.Revision)
		}
		w, err := newWireRangeStreamResponse(h, enc)
		if err != nil {
			return err
		}
		return stream.SendMsg(w)
	})
	if ok {
		if err != nil {
			return toGRPCError(err)
		}
		return nil
	}
	err = s.b.Store().RangeStream(r, s.limits.MaxRequestBytes, func(resp *pb.RangeResponse) error {
		if resp.Header != nil {
			fillHeader(s.b, &resp.Header, resp.Header.Revision)
		}
		return stream.Send(&pb.RangeStreamResponse{RangeResponse: resp})
	})
	if err != nil {
		return toGRPCError(err)
	}
	return nil
}

// Put writes a key.
func (s *KV) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	if err := checkPut(r); err != nil {
		return nil, err
	}
	res, err := s.propose(ctx, &pb.InternalRaftRequest{Put: r})
	if err != nil {
		return nil, err
	}
	resp := res.Response.(*pb.PutResponse)
	fillHeader(s.b, &resp.Header, 0)
	return resp, nil
}

// DeleteRange deletes keys.
func (s *KV) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	if len(r.Key) == 0 {
		return nil, rpctypes.ErrGRPCEmptyKey
	}
	res, err := s.propose(ctx, &pb.InternalRaftRequest{DeleteRange: r})
	if err != nil {
		return nil, err
	}
	resp := res.Response.(*pb.DeleteRangeResponse)
	fillHeader(s.b, &resp.Header, 0)
	return resp, nil
}

// Txn runs a transaction. One without writes is served like a read, from
// the local store after a ReadIndex barrier (none if every range in it is
// serializable), as etcd does; the others go through raft.
func (s *KV) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if err := checkTxn(r, s.limits.MaxTxnOps); err != nil {
		return nil, err
	}
	if _, _, err := checkIntervals(r.Success); err != nil {
		return nil, err
	}
	if _, _, err := checkIntervals(r.Failure); err != nil {
		return nil, err
	}
	if mvcc.IsTxnReadOnly(r) {
		// It will not propose: the node need not wait for it (countWrites).
		node.ReleaseArrival(ctx)
		if !txnSerializable(r) && !barrierDone(ctx) {
			if err := s.barrier(ctx); err != nil {
				return nil, err
			}
		}
		resp, err := s.b.Store().ReadTxn(r)
		if err != nil {
			return nil, toGRPCError(err)
		}
		fillHeader(s.b, &resp.Header, s.b.Store().Rev())
		return resp, nil
	}
	res, err := s.propose(ctx, &pb.InternalRaftRequest{Txn: r})
	if err != nil {
		return nil, err
	}
	resp := res.Response.(*pb.TxnResponse)
	fillHeader(s.b, &resp.Header, 0)
	return resp, nil
}

// Compact compacts the revision history. With physical set it returns only
// once the compacted revisions are removed from the engine.
func (s *KV) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	res, err := s.propose(ctx, &pb.InternalRaftRequest{Compaction: r})
	if err != nil {
		return nil, err
	}
	if r.Physical && res.Compacted != nil {
		select {
		case <-res.Compacted:
		case <-ctx.Done():
			return nil, toGRPCError(ctx.Err())
		}
	}
	resp := res.Response.(*pb.CompactionResponse)
	fillHeader(s.b, &resp.Header, 0)
	return resp, nil
}

// barrierDoneKey marks a context whose request already passed the read
// barrier (the auth interceptor waits for it before it checks a
// linearizable read, so that the check sees every auth change committed
// before the read, as etcd's does).
type barrierDoneKey struct{}

func withBarrierDone(ctx context.Context) context.Context {
	return context.WithValue(ctx, barrierDoneKey{}, true)
}

func barrierDone(ctx context.Context) bool {
	done, _ := ctx.Value(barrierDoneKey{}).(bool)
	return done
}

// linearizableRead reports whether req is a read that waits for the read
// barrier: a Range or a read-only Txn that is not serializable.
func linearizableRead(req any) bool {
	switch r := req.(type) {
	case *pb.RangeRequest:
		return !r.Serializable
	case *pb.TxnRequest:
		return mvcc.IsTxnReadOnly(r) && !txnSerializable(r)
	}
	return false
}

func (s *KV) barrier(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.limits.RequestTimeout)
	defer cancel()
	if err := s.b.ReadBarrier(ctx); err != nil {
		return toGRPCError(err)
	}
	return nil
}

// propose replicates a write and maps its outcome to etcd's errors.
func (s *KV) propose(ctx context.Context, req *pb.InternalRaftRequest) (apply.Result, error) {
	if proto.Size(req) > s.limits.MaxRequestBytes {
		return apply.Result{}, rpctypes.ErrGRPCRequestTooLarge
	}
	if err := checkKeySizes(s.b.Store(), req); err != nil {
		return apply.Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.limits.RequestTimeout)
	defer cancel()
	res, err := s.b.Propose(ctx, req)
	if err != nil {
		return apply.Result{}, toGRPCError(err)
	}
	if res.Err != nil {
		return apply.Result{}, toGRPCError(res.Err)
	}
	return res, nil
}

// toGRPCError maps an internal error to etcd's gRPC error.
func toGRPCError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, mvcc.ErrCompacted):
		return rpctypes.ErrGRPCCompacted
	case errors.Is(err, mvcc.ErrFutureRev):
		return rpctypes.ErrGRPCFutureRev
	case errors.Is(err, mvcc.ErrKeyNotFound):
		return rpctypes.ErrGRPCKeyNotFound
	case errors.Is(err, mvcc.ErrLeaseNotFound):
		return rpctypes.ErrGRPCLeaseNotFound
	case errors.Is(err, node.ErrNoLeader):
		return rpctypes.ErrGRPCNoLeader
	case errors.Is(err, node.ErrStopped):
		return rpctypes.ErrGRPCStopped
	case errors.Is(err, context.Canceled):
		return rpctypes.ErrGRPCCanceled
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, apply.ErrOutcomeUnknown):
		// etcd's answer when it cannot tell whether a request applied.
		return rpctypes.ErrGRPCTimeout
	}
	if e, ok := authGRPCError(err); ok {
		return e
	}
	return err
}

// txnSerializable reports whether every range of a read-only transaction
// (mvcc.IsTxnReadOnly: ranges only, none nested) asks for a serializable
// read.
func txnSerializable(r *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if rr := op.GetRequestRange(); rr != nil && !rr.Serializable {
				return false
			}
		}
	}
	return true
}
