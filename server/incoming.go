package server

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/tap"

	"github.com/strata-kv/strata/node"
)

// writeCounter counts each KV write request in Incoming from the moment
// gRPC reads its headers until its proposal reaches the node or the request
// ends, so that a leader's group commit can wait for the writes it knows
// are coming (node/incoming.go). gRPC calls its tap in the connection's
// reader, before the request's goroutine is started: under load most of a
// write's way to the node is the wait for that goroutine to run. The
// request's end (a stats.End, which gRPC reports for every request that
// reaches a registered method) releases it if the node has not: a Txn that
// proposes nothing, a request that fails before it proposes.
type writeCounter struct{ in *node.Incoming }

// tap is the grpc.InTapHandle.
func (w writeCounter) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	switch info.FullMethodName {
	case pb.KV_Put_FullMethodName, pb.KV_DeleteRange_FullMethodName, pb.KV_Txn_FullMethodName:
		return w.in.Arrive(ctx), nil
	}
	return ctx, nil
}

// TagRPC implements stats.Handler.
func (writeCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC implements stats.Handler.
func (writeCounter) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.End); ok {
		node.Release(ctx)
	}
}

// TagConn implements stats.Handler.
func (writeCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

// HandleConn implements stats.Handler.
func (writeCounter) HandleConn(context.Context, stats.ConnStats) {}
