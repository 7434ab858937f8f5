package node

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// heldReads counts the read waiters the node holds, queued or in a round.
func heldReads(n *Node) int {
	k := make(chan int, 1)
	n.control(func(*raft.RawNode) {
		held := len(n.readPending)
		for _, ws := range n.readInFlight {
			held += len(ws)
		}
		k <- held
	})
	return <-k
}

// TestReadWaitersDroppedWhenCallersGiveUp: while no ReadIndex round
// succeeds (a member without a leader), the reads whose callers gave up
// are dropped when the stalled round is retried, not carried into every
// later round: the node held one waiter per read for as long as the
// outage lasted (found by review).
func TestReadWaitersDroppedWhenCallersGiveUp(t *testing.T) {
	log := &memLog{MemoryStorage: raft.NewMemoryStorage()}
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	if err := log.MemoryStorage.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
		Index: proto.Uint64(5), Term: proto.Uint64(1), ConfState: cs}}); err != nil {
		t.Fatal(err)
	}
	if err := log.SetHardState(&raftpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(5)}); err != nil {
		t.Fatal(err)
	}
	// Member 1 of three, its peers unreachable: no leader, no round succeeds.
	n, _ := runNode(t, Config{ID: 1, Log: log, Applied: 5, ConfState: cs, TickInterval: time.Millisecond,
		ElectionTicks: 10, HeartbeatTicks: 1})
	go func() {
		for range n.Outgoing() {
		}
	}()
	const reads = 500
	for range reads {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Microsecond)
		_, _ = n.ReadIndex(ctx)
		cancel()
	}
	// A stalled round is retried after an election timeout (10 ms here).
	deadline := time.Now().Add(5 * time.Second)
	held := heldReads(n)
	for held > 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		held = heldReads(n)
	}
	if held > 1 {
		t.Fatalf("the node holds %d read waiters after their %d callers gave up", held, reads)
	}
}
