package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
)

// TestEngineFlushFailureStopsNode: an engine flush that fails (its disk
// gone) stops the node with the flush's error. The node logged it and went
// on: the log could no longer be truncated and grew without bound, while
// the member served as if nothing were wrong (found running a probe whose
// data directory was deleted under it).
func TestEngineFlushFailureStopsNode(t *testing.T) {
	diskGone := errors.New("open 000004.sst: no such file or directory")
	eng := &fakeEngine{flushErr: diskGone}
	n, err := New(Config{ID: 1, Peers: []raft.Peer{{ID: 1}}, Log: &memLog{MemoryStorage: raft.NewMemoryStorage()}, Engine: eng,
		TickInterval: time.Millisecond, ElectionTicks: 10, HeartbeatTicks: 1, SnapshotCount: 5, CatchUpEntries: 2,
		Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- n.Run(ctx) }()
	go func() {
		for {
			select {
			case c := <-n.Committed():
				if acceptChange(c) {
					continue
				}
				n.Applied(c.Entries[len(c.Entries)-1].GetIndex())
			case <-ctx.Done():
				return
			}
		}
	}()
	if err := n.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		_ = n.Propose(pctx, []byte("x"))
		pcancel()
		select {
		case err := <-runErr:
			if !errors.Is(err, diskGone) {
				t.Fatalf("Run ended with %v, want the flush's error", err)
			}
			return
		case <-ctx.Done():
			t.Fatal("the node still runs after its engine's flushes failed")
		default:
		}
		time.Sleep(5 * time.Millisecond)
	}
}
