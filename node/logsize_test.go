package node

import (
	"bytes"
	"context"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// entriesOf returns entries first..last, each holding size bytes of data.
func entriesOf(first, last uint64, size int) []*raftpb.Entry {
	var out []*raftpb.Entry
	for i := first; i <= last; i++ {
		out = append(out, &raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(1), Data: make([]byte, size)})
	}
	return out
}

func TestLogSize(t *testing.T) {
	const mib = 1 << 20
	perEntry := uint64(mib/4) + entryOverhead
	var s logSize
	// 40 entries of a quarter MiB, appended four at a time: a mark after
	// every append (each adds just over 1 MiB).
	for i := uint64(1); i <= 40; i += 4 {
		s.appended(entriesOf(i, i+3, mib/4))
	}
	for _, tc := range []struct {
		name     string
		from, to uint64
		want     uint64
	}{
		{"everything", 0, 40, 40 * perEntry},
		{"between marks", 4, 8, 4 * perEntry},
		{"to a mark's precision", 5, 10, 4 * perEntry}, // marks at 4 and 8
		{"backwards", 20, 10, 0},
	} {
		if got := s.between(tc.from, tc.to); got != tc.want {
			t.Errorf("%s: between(%d, %d) = %d, want %d", tc.name, tc.from, tc.to, got, tc.want)
		}
	}
	// Keeping 2 MiB below 40 keeps entries 33-40: 32 is the highest
	// mark with at least 2 MiB above it.
	if got, ok := s.keepBelow(40, 2*mib); !ok || got != 32 {
		t.Errorf("keepBelow(40, 2 MiB) = %d, %v; want 32, true", got, ok)
	}
	if _, ok := s.keepBelow(40, 100*mib); ok {
		t.Error("keepBelow found a margin larger than the whole log")
	}
	// A new leader rewrites 21-40 with small entries: the count resumes
	// from the mark at 20.
	s.appended(entriesOf(21, 22, 10))
	if got, want := s.between(0, 40), 20*perEntry; got != want {
		t.Errorf("after a rewrite from 21: between(0, 40) = %d, want %d", got, want)
	}
	// Truncating at 10 keeps the mark at 8 for bytesAt(10).
	s.forget(10)
	if got, want := s.between(10, 20), 12*perEntry; got != want {
		t.Errorf("after forget(10): between(10, 20) = %d, want %d", got, want)
	}
	if s.marks[0].index != 8 {
		t.Errorf("after forget(10) the first mark is at %d, want 8", s.marks[0].index)
	}
	s.reset()
	if got := s.between(0, 40); got != 0 {
		t.Errorf("after reset: between(0, 40) = %d, want 0", got)
	}
}

// TestLogTruncatedByBytes: a log of large entries is flushed and truncated
// once SnapshotBytes+CatchUpBytes were appended, long before the entry
// counts (SnapshotCount+CatchUpEntries) would do it, and keeps CatchUpBytes
// below the durable index, not CatchUpEntries. Before the byte bounds, a
// bulk load's 10,000 entries of 100 puts stayed in the log whole
// (docs/bench/report-20261128.md, "Where the disk after a load goes").
func TestLogTruncatedByBytes(t *testing.T) {
	const mib = 1 << 20
	log := &memLog{MemoryStorage: raft.NewMemoryStorage(), compactions: make(chan uint64, 64)}
	eng := &fakeEngine{}
	n, waitApplied := startNodeConfig(t, Config{
		ID: 1, Peers: []raft.Peer{{ID: 1}}, Log: log,
		TickInterval: time.Millisecond, ElectionTicks: 10, HeartbeatTicks: 1,
		SnapshotCount: 10000, CatchUpEntries: 5000,
		SnapshotBytes: 2 * mib, CatchUpBytes: 2 * mib,
	}, eng)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitLeader(ctx); err != nil {
		t.Fatalf("the only voter never became leader: %v", err)
	}
	value := bytes.Repeat([]byte("v"), mib/4)
	const proposals = 40 // 10 MiB
	for i := 0; i < proposals; i++ {
		if err := n.Propose(ctx, value); err != nil {
			t.Fatal(err)
		}
		// One entry per append, so that the log's byte marks fall every 4
		// entries (1 MiB): an append of several entries sets its mark
		// after all of them, and the margin below would widen with it.
		if got := waitApplied(i + 1); len(got) < i+1 {
			t.Fatalf("%d of %d proposals applied", len(got), i+1)
		}
	}
	var compactedTo uint64
	for compactedTo == 0 {
		select {
		case compactedTo = <-log.compactions:
		case <-ctx.Done():
			t.Fatalf("a log of %d MiB with SnapshotBytes+CatchUpBytes = 4 MiB was never truncated", proposals/4)
		}
	}
	// The truncation follows one of the flushes, keeping CatchUpBytes of
	// quarter-MiB entries below its durable index: 8 of them, or up to 4
	// more since marks are 1 MiB apart.
	eng.mu.Lock()
	flushes := append([]uint64(nil), eng.flushes...)
	eng.mu.Unlock()
	for _, durable := range flushes {
		if durable >= compactedTo+8 && durable <= compactedTo+12 {
			return
		}
	}
	t.Errorf("truncated to %d; no flush's durable index (%v) is 8-12 entries (2 MiB) above it", compactedTo, flushes)
}
