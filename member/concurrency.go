package member

import (
	"context"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/server"
	"github.com/strata-kv/strata/server/concurrency"
)

// registerConcurrency serves etcd's v3lock and v3election services on the
// client gRPC server, over the member's own KV and Lease services and
// watch hub, called in-process: a request's context (deadline, caller)
// reaches them as it came. REQUIRES: m.grpc, m.leases and m.watchHub are
// set.
func (m *Member) registerConcurrency(limits server.Limits) {
	concurrency.Register(m.grpc, concurrency.Backend{
		KV:        server.NewKV(m, limits),
		Leases:    m.leases,
		Watches:   m.watchHub,
		Authorize: m.authorizeConcurrency,
		Logger:    m.logger.Named("concurrency"),
	})
}

// authorizeConcurrency checks a KV request that the lock and election
// services make for their caller as the auth interceptor checks the KV
// service's own callers: reads and writes against the caller's
// permissions, nobody's when the call carries no token. (Writes are
// checked again when applied, as every write is.)
func (m *Member) authorizeConcurrency(ctx context.Context, req any) error {
	if m.authStore == nil || !m.authStore.Enabled() {
		return nil
	}
	ai := auth.FromContext(ctx)
	var err error
	switch r := req.(type) {
	case *pb.RangeRequest:
		err = m.authStore.IsRangePermitted(ai, r.Key, r.RangeEnd)
	case *pb.TxnRequest:
		err = m.authStore.IsTxnPermitted(ai, r)
	case *pb.DeleteRangeRequest:
		err = m.authStore.IsDeleteRangePermitted(ai, r.Key, r.RangeEnd)
	default:
		err = auth.ErrPermissionDenied // a request this check does not know
	}
	for _, e := range []struct{ auth, grpc error }{
		{auth.ErrUserEmpty, rpctypes.ErrGRPCUserEmpty},
		{auth.ErrUserNotFound, rpctypes.ErrGRPCUserNotFound},
		{auth.ErrPermissionDenied, rpctypes.ErrGRPCPermissionDenied},
		{auth.ErrAuthOldRevision, rpctypes.ErrGRPCAuthOldRevision},
		{auth.ErrInvalidAuthToken, rpctypes.ErrGRPCInvalidAuthToken},
	} {
		if errors.Is(err, e.auth) {
			return e.grpc
		}
	}
	return err
}
