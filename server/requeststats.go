package server

import (
	"context"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
)

// DefaultWarnUnaryRequestDuration is etcd's --warning-unary-request-duration.
const DefaultWarnUnaryRequestDuration = 300 * time.Millisecond

// RequestStatsOptions returns the gRPC option that logs unary requests as
// etcd does: every request at debug level, and a request that took longer
// than warn (--warning-unary-request-duration; 0: etcd's 300ms) at warn
// level, under etcd's message "request stats" and field names, with the
// values of puts left out as etcd leaves them out.
func RequestStatsOptions(warn time.Duration, logger *zap.Logger) grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(requestStats(warn, logger))
}

// requestStats is RequestStatsOptions' interceptor.
func requestStats(warn time.Duration, logger *zap.Logger) grpc.UnaryServerInterceptor {
	if warn <= 0 {
		warn = DefaultWarnUnaryRequestDuration
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		took := time.Since(start)
		debug := logger.Core().Enabled(zap.DebugLevel)
		if took <= warn && !debug {
			return resp, err
		}
		remote := "No remote client info."
		if p, ok := peer.FromContext(ctx); ok {
			remote = p.Addr.String()
		}
		s := statsOf(req, resp)
		fields := []zap.Field{
			zap.Time("start time", start),
			zap.Duration("time spent", took),
			zap.String("remote", remote),
			zap.String("response type", info.FullMethod),
			zap.Int64("request count", s.reqCount),
			zap.Int("request size", s.reqSize),
			zap.Int64("response count", s.respCount),
			zap.Int("response size", s.respSize),
			zap.String("request content", s.content),
		}
		if took > warn {
			logger.Warn("request stats", fields...)
		} else {
			logger.Debug("request stats", fields...)
		}
		return resp, err
	}
}

// reqStats are the sizes and counts etcd logs for a request.
type reqStats struct {
	reqCount, respCount int64
	reqSize, respSize   int
	content             string
}

// statsOf counts as etcd counts: the keys a range returned, one put, the
// keys a delete removed, the operations of the branch a txn took; -1 for
// other requests.
func statsOf(req, resp any) reqStats {
	size := func(m proto.Message) int {
		if m == nil {
			return 0
		}
		return proto.Size(m)
	}
	switch r := req.(type) {
	case *pb.RangeRequest:
		if w, ok := resp.(*wireRangeResponse); ok {
			return reqStats{respCount: w.count, reqSize: size(r), respSize: w.size(), content: r.String()}
		}
		out, _ := resp.(*pb.RangeResponse)
		return reqStats{respCount: out.GetCount(), reqSize: size(r), respSize: size(out), content: r.String()}
	case *pb.PutRequest:
		out, _ := resp.(*pb.PutResponse)
		return reqStats{reqCount: 1, reqSize: size(r), respSize: size(out), content: pb.NewLoggablePutRequest(r).String()}
	case *pb.DeleteRangeRequest:
		out, _ := resp.(*pb.DeleteRangeResponse)
		return reqStats{respCount: out.GetDeleted(), reqSize: size(r), respSize: size(out), content: r.String()}
	case *pb.TxnRequest:
		out, _ := resp.(*pb.TxnResponse)
		ops := r.GetFailure()
		if out.GetSucceeded() {
			ops = r.GetSuccess()
		}
		s := reqStats{reqCount: int64(len(ops)), respSize: size(out), content: pb.NewLoggableTxnRequest(r).String()}
		for _, op := range ops {
			s.reqSize += size(op)
		}
		return s
	}
	return reqStats{reqCount: -1, reqSize: -1, respCount: -1, respSize: -1}
}
