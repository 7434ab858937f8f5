package e2e

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestWatchProgressRequestLikeEtcd: a progress request on a watch stream
// with no watch gets no answer (etcd's progressIfSync has no watcher to
// speak for); once the stream holds a synced watch, it is answered with
// watch ID -1 at the store's revision. Run against both servers; strata
// answered the first one (found by review).
func TestWatchProgressRequestLikeEtcd(t *testing.T) {
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			p := start(t, f)
			cli := p.Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			stream, err := pb.NewWatchClient(cli.ActiveConnection()).Watch(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *pb.WatchResponse, 16)
			go func() {
				defer close(got)
				for {
					r, err := stream.Recv()
					if err != nil {
						return
					}
					got <- r
				}
			}()
			progress := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}
			if err := stream.Send(progress); err != nil {
				t.Fatal(err)
			}
			// Long enough for an answer on loopback, many times over.
			select {
			case r := <-got:
				t.Fatalf("a progress request with no watch was answered: %v", r)
			case <-time.After(500 * time.Millisecond):
			}
			create := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{Key: []byte("k")}}}
			if err := stream.Send(create); err != nil {
				t.Fatal(err)
			}
			recv := func() *pb.WatchResponse {
				t.Helper()
				select {
				case r, ok := <-got:
					if !ok {
						t.Fatal("watch stream ended")
					}
					return r
				case <-ctx.Done():
					t.Fatal("no watch response")
				}
				return nil
			}
			if r := recv(); !r.Created {
				t.Fatalf("first response %v, want created", r)
			}
			put, err := cli.Put(ctx, "k", "v")
			if err != nil {
				t.Fatal(err)
			}
			if r := recv(); len(r.Events) != 1 {
				t.Fatalf("response %v, want the put", r)
			}
			if err := stream.Send(progress); err != nil {
				t.Fatal(err)
			}
			if r := recv(); r.WatchId != -1 || len(r.Events) != 0 || r.Header.Revision != put.Header.Revision {
				t.Fatalf("progress answer %v, want watch ID -1 at revision %d", r, put.Header.Revision)
			}
		})
	}
}
