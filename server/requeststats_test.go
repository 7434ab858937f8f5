package server

import (
	"context"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
)

// TestRequestStats: a unary request slower than
// --warning-unary-request-duration is logged at warn level with etcd's
// message and fields, a put's value left out; a fast one only at debug.
func TestRequestStats(t *testing.T) {
	for _, tc := range []struct {
		name      string
		level     zapcore.Level
		delay     time.Duration
		wantLevel zapcore.Level
		wantLogs  int
	}{
		{name: "slow put", level: zap.InfoLevel, delay: 30 * time.Millisecond, wantLevel: zap.WarnLevel, wantLogs: 1},
		{name: "fast put", level: zap.InfoLevel, wantLogs: 0},
		{name: "fast put, debug", level: zap.DebugLevel, wantLevel: zap.DebugLevel, wantLogs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(tc.level)
			interceptor := requestStats(10*time.Millisecond, zap.New(core))
			req := &pb.PutRequest{Key: []byte("k"), Value: []byte("secret-value")}
			_, err := interceptor(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: "/etcdserverpb.KV/Put"},
				func(context.Context, any) (any, error) {
					time.Sleep(tc.delay)
					return &pb.PutResponse{}, nil
				})
			if err != nil {
				t.Fatal(err)
			}
			if logs.Len() != tc.wantLogs {
				t.Fatalf("%d log entries, want %d", logs.Len(), tc.wantLogs)
			}
			if tc.wantLogs == 0 {
				return
			}
			e := logs.All()[0]
			fields := e.ContextMap()
			if e.Message != "request stats" || e.Level != tc.wantLevel || fields["response type"] != "/etcdserverpb.KV/Put" || fields["request count"] != int64(1) {
				t.Errorf("logged %s %q %v", e.Level, e.Message, fields)
			}
			if content, _ := fields["request content"].(string); strings.Contains(content, "secret-value") || !strings.Contains(content, "value_size") {
				t.Errorf("request content %q: the value must be left out, its size given", content)
			}
		})
	}
}
