package concurrency

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/server/concurrency/v3electionpb"
	"github.com/strata-kv/strata/server/concurrency/v3lockpb"
	"github.com/strata-kv/strata/watch"
)

// SessionTTL is the TTL in seconds of the lease granted for a Lock,
// Campaign or Proclaim that names none: etcd's default session TTL.
const SessionTTL = 60

// cleanupTimeout bounds the deletion of a waiter's key after its request
// failed; the caller has gone, so nothing else bounds it.
const cleanupTimeout = 5 * time.Second

// KV is the part of etcd's KV service the recipes use; server.KV
// implements it. Its errors are etcd's gRPC errors and pass through.
type KV interface {
	Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error)
	Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error)
	DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error)
}

// Leases grants the lease of a request that names none; server.Lease
// implements it.
type Leases interface {
	LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error)
}

// Watches opens watch streams on the member's watch hub (*watch.Hub).
type Watches interface {
	NewStream() *watch.Stream
}

// Backend is what the services build on: the member's own services.
type Backend struct {
	KV      KV
	Leases  Leases
	Watches Watches
	// Authorizer, if set, decides whether the callers may make the KV
	// requests made on their behalf. The services call KV in-process, past
	// the gRPC interceptors that check the KV service's callers, so they
	// ask it before every KV call they make for a caller.
	Authorizer Authorizer
	// Logger reports failed clean-ups; nil means zap.NewNop().
	Logger *zap.Logger
}

// Authorizer checks a KV request made for a caller (server.Auth).
type Authorizer interface {
	// AuthorizeKV decides whether the caller whose request context is ctx
	// may make req (a *pb.RangeRequest, *pb.TxnRequest or
	// *pb.DeleteRangeRequest) and returns etcd's gRPC error if not.
	AuthorizeKV(ctx context.Context, req any) error
}

// Register serves both services on s.
func Register(s *grpc.Server, b Backend) {
	v3lockpb.RegisterLockServer(s, NewLock(b))
	v3electionpb.RegisterElectionServer(s, NewElection(b))
}

// recipe holds the steps that Lock and Election share.
type recipe struct {
	b      Backend
	logger *zap.Logger
}

func newRecipe(b Backend) recipe {
	logger := b.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	if b.Authorizer != nil {
		b.KV = authorizedKV{kv: b.KV, authorizer: b.Authorizer}
	}
	return recipe{b: b, logger: logger}
}

// authorizedKV asks authorizer before each call of kv.
type authorizedKV struct {
	kv         KV
	authorizer Authorizer
}

func (a authorizedKV) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	if err := a.authorizer.AuthorizeKV(ctx, r); err != nil {
		return nil, err
	}
	return a.kv.Range(ctx, r)
}

func (a authorizedKV) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	if err := a.authorizer.AuthorizeKV(ctx, r); err != nil {
		return nil, err
	}
	return a.kv.Txn(ctx, r)
}

func (a authorizedKV) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	if err := a.authorizer.AuthorizeKV(ctx, r); err != nil {
		return nil, err
	}
	return a.kv.DeleteRange(ctx, r)
}

// session returns lease, or grants one of SessionTTL seconds if it is 0
// (etcd's concurrency.NewSession without a lease).
func (r recipe) session(ctx context.Context, lease int64) (int64, error) {
	if lease != 0 {
		return lease, nil
	}
	resp, err := r.b.Leases.LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: SessionTTL})
	if err != nil {
		return 0, err
	}
	return resp.ID, nil
}

// ownKey is the key a participant with lease owns under prefix pfx.
func ownKey(pfx string, lease int64) string { return fmt.Sprintf("%s%x", pfx, lease) }

// acquire creates key with value and lease unless it exists (then it
// reads it), and reads the prefix's owner in the same transaction. It
// returns the response and key's create revision: the revision that
// orders the participant in the queue.
func (r recipe) acquire(ctx context.Context, pfx, key, value string, lease int64) (*pb.TxnResponse, int64, error) {
	resp, err := r.b.KV.Txn(ctx, &pb.TxnRequest{
		Compare: []*pb.Compare{createRevIs(key, 0)},
		Success: []*pb.RequestOp{
			{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: []byte(value), Lease: lease}}},
			{Request: &pb.RequestOp_RequestRange{RequestRange: firstCreated(pfx)}},
		},
		Failure: []*pb.RequestOp{
			{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(key)}}},
			{Request: &pb.RequestOp_RequestRange{RequestRange: firstCreated(pfx)}},
		},
	})
	if err != nil {
		return nil, 0, err
	}
	if len(resp.Responses) != 2 {
		return nil, 0, fmt.Errorf("acquire %q: txn answered %d responses, want 2", key, len(resp.Responses))
	}
	if resp.Succeeded {
		return resp, resp.Header.Revision, nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		// The compare said the key exists; the same txn must read it.
		return nil, 0, fmt.Errorf("acquire %q: key exists but the txn read none", key)
	}
	return resp, kvs[0].CreateRevision, nil
}

// owner returns the prefix's owner read by acquire, nil if none.
func owner(resp *pb.TxnResponse) *mvccpb.KeyValue {
	kvs := resp.Responses[1].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

// waitDeletes returns once no key under pfx has a create revision at or
// below maxCreateRev: it watches the newest such key until it is deleted,
// then looks again. It returns the header of the last read, which found
// none.
func (r recipe) waitDeletes(ctx context.Context, pfx string, maxCreateRev int64) (*pb.ResponseHeader, error) {
	for {
		resp, err := r.b.KV.Range(ctx, &pb.RangeRequest{
			Key: []byte(pfx), RangeEnd: prefixEnd(pfx), Limit: 1,
			SortOrder: pb.RangeRequest_DESCEND, SortTarget: pb.RangeRequest_CREATE,
			MaxCreateRevision: maxCreateRev,
		})
		if err != nil {
			return nil, err
		}
		if len(resp.Kvs) == 0 {
			return resp.Header, nil
		}
		if err := r.waitDelete(ctx, resp.Kvs[0].Key, resp.Header.Revision); err != nil {
			return nil, err
		}
	}
}

// waitDelete returns once key is deleted at or after revision rev, or
// once the watch is canceled by a revision compaction (the caller reads
// again: etcd's recipe fails there instead, though nothing is wrong).
func (r recipe) waitDelete(ctx context.Context, key []byte, rev int64) error {
	ws, err := r.watch(key, nil, rev)
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
		}
	}
}

// watch opens a stream with one watch on [key, end) (end nil: key
// alone; empty: every key from key on) from revision rev.
func (r recipe) watch(key, end []byte, rev int64) (*watch.Stream, error) {
	ws := r.b.Watches.NewStream()
	if _, err := ws.Watch(watch.Request{Key: key, End: end, StartRev: rev}); err != nil {
		ws.Close()
		return nil, watchError(err)
	}
	return ws, nil
}

// next returns the next response of a single-watch stream, skipping the
// created notice; a canceled watch is an error unless a revision
// compaction canceled it (then the response says so).
func next(ctx context.Context, ws *watch.Stream) (*pb.WatchResponse, error) {
	for {
		resp, err := ws.Next(ctx)
		if err != nil {
			return nil, watchError(err)
		}
		switch {
		case resp.Canceled && resp.CompactRevision != 0:
			return resp.WatchResponse, nil
		case resp.Canceled:
			return nil, fmt.Errorf("watch canceled: %s", resp.CancelReason)
		case resp.Created || len(resp.Events) == 0:
			continue // created notice or progress notification
		}
		return resp.WatchResponse, nil
	}
}

// watchError maps a watch hub or context error to etcd's gRPC errors.
func watchError(err error) error {
	switch {
	case errors.Is(err, watch.ErrClosed):
		return rpctypes.ErrGRPCStopped
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return err
}

// asEtcd gives an error from the member's services the gRPC code etcd's
// lock and election services answer with: Unknown, keeping etcd's message
// (etcd runs the recipe through an in-process client, whose errors carry
// no gRPC status). Plain errors are Unknown already; a canceled or
// expired request keeps its code.
func asEtcd(err error) error {
	st, ok := status.FromError(err)
	if err == nil || !ok {
		return err
	}
	switch st.Code() {
	case codes.Unknown, codes.Canceled, codes.DeadlineExceeded:
		return err
	}
	return status.Error(codes.Unknown, st.Message())
}

// cleanup runs fn, which undoes a failed request's write, with the
// request's values (its auth metadata) but not its cancellation, bounded
// by cleanupTimeout, and logs a failure: the lease's expiry ends the key
// in any case.
func (r recipe) cleanup(ctx context.Context, what string, key string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := fn(ctx); err != nil {
		r.logger.Warn("could not clean up after a failed request; the key stays until its lease ends",
			zap.String("request", what), zap.String("key", key), zap.Error(err))
	}
}

// createRevIs compares key's create revision with rev (0: key absent).
func createRevIs(key string, rev int64) *pb.Compare {
	return &pb.Compare{
		Key: []byte(key), Target: pb.Compare_CREATE, Result: pb.Compare_EQUAL,
		TargetUnion: &pb.Compare_CreateRevision{CreateRevision: rev},
	}
}

// firstCreated reads the key of pfx with the lowest create revision.
func firstCreated(pfx string) *pb.RangeRequest {
	return &pb.RangeRequest{
		Key: []byte(pfx), RangeEnd: prefixEnd(pfx), Limit: 1,
		SortOrder: pb.RangeRequest_ASCEND, SortTarget: pb.RangeRequest_CREATE,
	}
}

// prefixEnd is the range end that covers every key starting with pfx
// (clientv3.GetPrefixRangeEnd): pfx with its last byte below 0xff
// incremented and the rest dropped; "\x00" (every key) if there is none.
func prefixEnd(pfx string) []byte {
	end := []byte(pfx)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}
