package node

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
)

func TestIncomingReleasesEachArrivalOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		// steps release the arrival: "node" as the node does when it
		// takes the proposal, "caller" through ReleaseArrival.
		steps []string
	}{
		{"node then caller", []string{"node", "caller"}},
		{"caller then node", []string{"caller", "node"}},
		{"caller twice", []string{"caller", "caller"}},
		{"caller only", []string{"caller"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var in Incoming
			ctx := in.Arrive(context.Background())
			other := in.Arrive(context.Background())
			if got := in.Pending(); got != 2 {
				t.Fatalf("pending after two arrivals = %d, want 2", got)
			}
			for _, s := range tc.steps {
				if s == "node" {
					arrivalOf(ctx).taken()
				} else {
					ReleaseArrival(ctx)
				}
				if got := in.Pending(); got != 1 {
					t.Fatalf("pending after %v = %d, want 1 (the other arrival)", s, got)
				}
			}
			ReleaseArrival(other)
			if got := in.Pending(); got != 0 {
				t.Fatalf("pending = %d, want 0", got)
			}
		})
	}
	var none *Incoming
	ctx := none.Arrive(context.Background())
	ReleaseArrival(ctx)
	if none.Pending() != 0 || arrivalOf(ctx) != nil {
		t.Fatal("a nil Incoming counted an arrival")
	}
}

// startCountingNode runs a one-member node whose group commit waits for
// in, up to wait, and returns it once it leads and has applied one entry,
// "warm-up" (so that the leader's own first append is behind it), with its
// log and the function that waits for applied entries (startNodeConfig).
func startCountingNode(t *testing.T, in *Incoming, wait time.Duration) (*Node, *memLog, func(n int) []string) {
	t.Helper()
	log := &memLog{MemoryStorage: raft.NewMemoryStorage()}
	n, got := startNodeConfig(t, Config{
		ID: 1, Peers: []raft.Peer{{ID: 1}}, Log: log,
		TickInterval: time.Millisecond, ElectionTicks: 10, HeartbeatTicks: 1,
		SnapshotCount: 1000, CatchUpEntries: 2, Incoming: in, IncomingWait: wait,
	}, &fakeEngine{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitLeader(ctx); err != nil {
		t.Fatalf("no leader: %v", err)
	}
	if err := n.Propose(ctx, []byte("warm-up")); err != nil {
		t.Fatal(err)
	}
	if entries := got(1); len(entries) != 1 {
		t.Fatalf("applied %q, want the warm-up entry", entries)
	}
	return n, log, got
}

func (l *memLog) appendCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.appends
}

// A leader that has taken a proposal holds its append while another counted
// write is on its way, and appends both with one sync.
func TestLeaderWaitsForWritesOnTheirWay(t *testing.T) {
	var in Incoming
	n, log, got := startCountingNode(t, &in, time.Minute)
	before := log.appendCount()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, second := in.Arrive(ctx), in.Arrive(ctx)
	defer ReleaseArrival(first)
	defer ReleaseArrival(second)
	if err := n.Propose(first, []byte("first")); err != nil {
		t.Fatal(err)
	}
	// The node took the first proposal (Propose returned); the second is
	// still counted, so nothing is appended yet.
	time.Sleep(50 * time.Millisecond)
	if a := log.appendCount(); a != before {
		t.Fatalf("%d appends while a counted write was on its way, want none", a-before)
	}
	if err := n.Propose(second, []byte("second")); err != nil {
		t.Fatal(err)
	}
	if entries := got(3); len(entries) != 3 {
		t.Fatalf("applied %q, want the warm-up and both proposals", entries)
	}
	if a := log.appendCount(); a != before+1 {
		t.Fatalf("%d appends for the two proposals, want 1", a-before)
	}
	if p := in.Pending(); p != 0 {
		t.Fatalf("pending = %d after both proposals were taken, want 0", p)
	}
	if waits, timeouts := n.IncomingWaits(); waits != 1 || timeouts != 0 {
		t.Fatalf("IncomingWaits = %d, %d; want one hold, ended by the write, not the bound", waits, timeouts)
	}
}

// A counted write that never proposes holds an append no longer than
// IncomingWait.
func TestWaitForWritesOnTheirWayIsBounded(t *testing.T) {
	var in Incoming
	n, _, got := startCountingNode(t, &in, 20*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lost := in.Arrive(ctx) // a request that fails before it proposes
	defer ReleaseArrival(lost)
	start := time.Now()
	if err := n.Propose(ctx, []byte("alone")); err != nil {
		t.Fatal(err)
	}
	if entries := got(2); len(entries) != 2 {
		t.Fatalf("applied %q, want the warm-up and the proposal", entries)
	}
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Fatalf("committed after %v, before the wait's bound: the node did not wait for the counted write", took)
	}
	if waits, timeouts := n.IncomingWaits(); waits < 1 || timeouts != waits {
		t.Fatalf("IncomingWaits = %d, %d; want every hold to have run to the bound", waits, timeouts)
	}
}

// A lone writer, the only one counted, is appended at once: the node never
// waits for the write it already holds.
func TestLoneWriteIsNotHeld(t *testing.T) {
	var in Incoming
	n, _, got := startCountingNode(t, &in, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 3 {
		counted := in.Arrive(ctx)
		if err := n.Propose(counted, []byte{'a' + byte(i)}); err != nil {
			t.Fatal(err)
		}
		ReleaseArrival(counted)
		if entries := got(i + 2); len(entries) != i+2 {
			t.Fatalf("write %d not applied within 10 s (applied %q): the node held it", i, entries)
		}
	}
	if waits, _ := n.IncomingWaits(); waits != 0 {
		t.Fatalf("IncomingWaits = %d holds for lone writes, want 0", waits)
	}
}

// A request that ends without proposing (its context done) is released by
// its end.
func TestIncomingReleasedAtRequestEnd(t *testing.T) {
	var in Incoming
	ctx, cancel := context.WithCancel(context.Background())
	counted := in.Arrive(ctx)
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for in.Pending() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("pending = %d after the request ended, want 0", in.Pending())
		}
		time.Sleep(time.Millisecond)
	}
	// The node taking it afterwards changes nothing.
	arrivalOf(counted).taken()
	if p := in.Pending(); p != 0 {
		t.Fatalf("pending = %d, want 0", p)
	}
}

// Stopping the node ends a hold at once, not at the wait's bound.
func TestStopEndsTheWaitForWritesOnTheirWay(t *testing.T) {
	var in Incoming
	n, err := New(Config{
		ID: 1, Peers: []raft.Peer{{ID: 1}}, Log: &memLog{MemoryStorage: raft.NewMemoryStorage()},
		TickInterval: time.Millisecond, ElectionTicks: 10, HeartbeatTicks: 1,
		SnapshotCount: 1000, CatchUpEntries: 2, Incoming: &in, IncomingWait: time.Minute,
		Engine: &fakeEngine{}, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	go func() {
		for {
			select {
			case c := <-n.Committed():
				acceptChange(c) // bootstrap's membership entries
			case <-ctx.Done():
				return
			}
		}
	}()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := n.WaitLeader(wctx); err != nil {
		t.Fatalf("no leader: %v", err)
	}
	lost := in.Arrive(wctx) // never proposes: the node holds for it
	defer ReleaseArrival(lost)
	if err := n.Propose(wctx, []byte("held")); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of its context's end: the hold ignored it")
	}
}
