package server

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/node"
)

// countingKV answers KV requests as the test scripts them and records what
// the write counter said while each ran.
type countingKV struct {
	pb.UnimplementedKVServer
	in *node.Incoming
	// putRunning is told when a Put starts; putRelease ends it.
	putRunning chan int64
	putRelease chan struct{}
}

func (k *countingKV) Put(ctx context.Context, _ *pb.PutRequest) (*pb.PutResponse, error) {
	k.putRunning <- k.in.Pending()
	select {
	case <-k.putRelease:
	case <-ctx.Done():
	}
	return &pb.PutResponse{}, nil
}

func (k *countingKV) Range(context.Context, *pb.RangeRequest) (*pb.RangeResponse, error) {
	if p := k.in.Pending(); p != 0 {
		return nil, status.Errorf(codes.Internal, "a Range was counted: pending %d", p)
	}
	return &pb.RangeResponse{}, nil
}

func (k *countingKV) Txn(context.Context, *pb.TxnRequest) (*pb.TxnResponse, error) {
	return &pb.TxnResponse{}, nil
}

func (k *countingKV) DeleteRange(context.Context, *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	return nil, status.Error(codes.InvalidArgument, "refused before it proposes")
}

// Every counted write is released when it ends, however it ends, and reads
// are not counted: a leaked count would hold every append of the leader
// for node.Config.IncomingWait.
func TestWriteCounterReleasesEveryRequest(t *testing.T) {
	in := &node.Incoming{}
	kv := &countingKV{in: in, putRunning: make(chan int64, 1), putRelease: make(chan struct{})}
	srv := grpc.NewServer(grpc.InTapHandle(countWrites(in)))
	pb.RegisterKVServer(srv, kv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pb.NewKVClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// released waits (bounded) for the count to fall to zero: gRPC
	// reports a request's end after it answered.
	released := func(what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for in.Pending() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("after %s: pending = %d, want 0", what, in.Pending())
			}
			time.Sleep(time.Millisecond)
		}
	}

	// A Put is counted while it runs, and released when it ends.
	done := make(chan error, 1)
	go func() { _, err := client.Put(ctx, &pb.PutRequest{Key: []byte("k")}); done <- err }()
	if p := <-kv.putRunning; p != 1 {
		t.Fatalf("pending while a Put runs = %d, want 1", p)
	}
	kv.putRelease <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	released("a Put")

	// A Put whose client gave up.
	putCtx, putCancel := context.WithCancel(ctx)
	go func() { _, err := client.Put(putCtx, &pb.PutRequest{Key: []byte("k")}); done <- err }()
	if p := <-kv.putRunning; p != 1 {
		t.Fatalf("pending while a Put runs = %d, want 1", p)
	}
	putCancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled Put: %v, want Canceled", err)
	}
	released("a cancelled Put")

	// A read-only Txn, a refused DeleteRange, and a Range (not counted).
	if _, err := client.Txn(ctx, &pb.TxnRequest{}); err != nil {
		t.Fatal(err)
	}
	released("a Txn")
	if _, err := client.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte("k")}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("DeleteRange: %v, want the handler's refusal", err)
	}
	released("a refused DeleteRange")
	if _, err := client.Range(ctx, &pb.RangeRequest{Key: []byte("k")}); err != nil {
		t.Fatal(errors.Join(errors.New("Range"), err))
	}
	released("a Range")
}
