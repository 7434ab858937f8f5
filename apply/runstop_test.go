package apply

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/node"
)

// TestWaitAppliedEndsWithRun: a wait for an index the applier will never
// reach, because Run failed (an entry it cannot decode, an engine error),
// returns Run's error. It waited for its context alone, and the restores
// that replay a log with a context without deadline (an etcd data
// directory's WAL, a point in time) hung for good (found by review).
func TestWaitAppliedEndsWithRun(t *testing.T) {
	_, store := openStore(t, vfs.NewMem())
	a, err := New(Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan node.Committed, 1)
	runErr := make(chan error, 1)
	go func() { runErr <- a.Run(context.Background(), in) }()
	in <- node.Committed{Entries: []*raftpb.Entry{{Index: proto.Uint64(1), Term: proto.Uint64(1),
		Type: raftpb.EntryNormal.Enum(), Data: []byte{0xff}}}}
	waited := make(chan error, 1)
	go func() { waited <- a.WaitApplied(context.Background(), 1) }()
	select {
	case err := <-waited:
		if err == nil || errors.Is(err, ErrStopped) {
			t.Fatalf("WaitApplied after Run failed: %v, want Run's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitApplied still waiting after Run failed")
	}
	if err := <-runErr; err == nil {
		t.Fatal("Run applied an undecodable entry")
	}
	// A Run that ended without an error (its context) ends later waits too.
	b, err := New(Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx, make(chan node.Committed)) }()
	cancel()
	<-done
	if err := b.WaitApplied(context.Background(), 1000); !errors.Is(err, ErrStopped) {
		t.Fatalf("WaitApplied after Run returned: %v, want ErrStopped", err)
	}
}
