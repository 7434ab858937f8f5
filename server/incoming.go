package server

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/tap"

	"github.com/strata-kv/strata/node"
)

// countWrites returns the gRPC tap that counts each KV write request in in,
// so that a leader's group commit can wait for the writes it knows are
// coming (node/incoming.go). gRPC calls a tap in the connection's reader,
// before the request's goroutine is started: under load most of a write's
// way to the node is the wait for that goroutine to run. The count ends
// when the node takes the request's proposal, when KV.Txn finds a Txn
// read-only, or, for a request that never proposes for another reason (one
// refused or cancelled), when gRPC cancels the request's context at its
// end. Reads pay one switch on the method.
func countWrites(in *node.Incoming) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		switch info.FullMethodName {
		case pb.KV_Put_FullMethodName, pb.KV_DeleteRange_FullMethodName, pb.KV_Txn_FullMethodName:
			return in.Arrive(ctx), nil
		}
		return ctx, nil
	}
}
