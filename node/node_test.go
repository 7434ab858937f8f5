package node

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// memLog is a raft log in memory: the node is tested alone, against the
// interface the real log implements (raftlog has its own tests).
type memLog struct {
	*raft.MemoryStorage
	mu        sync.Mutex
	appends   int // appends that carried entries
	compacted uint64
}

func (l *memLog) Append(entries []*raftpb.Entry, hs *raftpb.HardState) error {
	if len(entries) > 0 {
		l.mu.Lock()
		l.appends++
		l.mu.Unlock()
		// An fsync takes time; proposals that arrive meanwhile must
		// share the next one.
		time.Sleep(200 * time.Microsecond)
	}
	if hs != nil {
		if err := l.SetHardState(hs); err != nil {
			return err
		}
	}
	return l.MemoryStorage.Append(entries)
}

func (l *memLog) Compact(index uint64, cs *raftpb.ConfState) error {
	if _, err := l.CreateSnapshot(index, cs, nil); err != nil {
		return err
	}
	l.mu.Lock()
	l.compacted = index
	l.mu.Unlock()
	return l.MemoryStorage.Compact(index)
}

// fakeEngine reports as durable whatever the test says was applied.
type fakeEngine struct {
	mu      sync.Mutex
	applied uint64
	durable uint64
}

func (e *fakeEngine) Flush() error {
	e.mu.Lock()
	e.durable = e.applied
	e.mu.Unlock()
	return nil
}

func (e *fakeEngine) DurableIndex() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.durable
}

// startNode runs a one-member node and an applier loop that records the
// data of every committed normal entry.
func startNode(t *testing.T, log *memLog, eng *fakeEngine, applied uint64, cs *raftpb.ConfState, snapshotCount uint64) (*Node, func() []string) {
	t.Helper()
	var peers []raft.Peer
	if last, _ := log.LastIndex(); last == 0 {
		peers = []raft.Peer{{ID: 1}}
	}
	n, err := New(Config{
		ID: 1, Peers: peers, Log: log, Engine: eng, Applied: applied, ConfState: cs,
		TickInterval: time.Millisecond, ElectionTicks: 10, HeartbeatTicks: 1,
		SnapshotCount: snapshotCount, CatchUpEntries: 2, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var got []string
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = n.Run(ctx) }()
	go func() {
		defer wg.Done()
		for {
			select {
			case c := <-n.Committed():
				mu.Lock()
				for _, e := range c.Entries {
					if e.GetType() == raftpb.EntryNormal && len(e.GetData()) > 0 {
						got = append(got, string(e.GetData()))
					}
				}
				mu.Unlock()
				last := c.Entries[len(c.Entries)-1].GetIndex()
				eng.mu.Lock()
				eng.applied = last
				eng.mu.Unlock()
				n.Applied(last)
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return n, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

func TestSingleMemberCommitsProposalsInOrder(t *testing.T) {
	log := &memLog{MemoryStorage: raft.NewMemoryStorage()}
	n, got := startNode(t, log, &fakeEngine{}, 0, nil, 1000)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitLeader(ctx); err != nil {
		t.Fatalf("no leader: %v", err)
	}
	const count = 200
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < count/4; i++ {
				if err := n.Propose(ctx, []byte(fmt.Sprintf("w%d-%03d", w, i))); err != nil {
					t.Errorf("propose: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	idx, err := n.ReadIndex(ctx)
	if err != nil {
		t.Fatalf("read index: %v", err)
	}
	if last, _ := log.LastIndex(); idx < last-1 {
		t.Fatalf("read index %d is behind the log's last index %d", idx, last)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(got()) < count && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	entries := got()
	if len(entries) != count {
		t.Fatalf("applied %d entries, want %d", len(entries), count)
	}
	// Each writer's entries arrive in the order it proposed them.
	next := map[byte]int{}
	for _, e := range entries {
		var w byte
		var i int
		fmt.Sscanf(e, "w%c-%d", &w, &i)
		if i != next[w] {
			t.Fatalf("writer %c: got entry %d, want %d", w, i, next[w])
		}
		next[w]++
	}
	log.mu.Lock()
	appends := log.appends
	log.mu.Unlock()
	if appends >= count {
		t.Errorf("%d log appends for %d proposals: proposals are not group-committed", appends, count)
	}
}

func TestLogIsCompactedOnlyBelowTheDurableIndex(t *testing.T) {
	log := &memLog{MemoryStorage: raft.NewMemoryStorage()}
	eng := &fakeEngine{}
	n, _ := startNode(t, log, eng, 0, nil, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		if err := n.Propose(ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		log.mu.Lock()
		c := log.compacted
		log.mu.Unlock()
		if c > 0 {
			if d := eng.DurableIndex(); c > d {
				t.Fatalf("log compacted to %d, past the durable index %d", c, d)
			}
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("log never compacted after 50 entries with snapshot count 10")
}

func testLogger(t *testing.T) *zap.Logger { return zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)) }

func (l *memLog) ApplySnapshot(meta *raftpb.SnapshotMetadata) error {
	return l.MemoryStorage.ApplySnapshot(&raftpb.Snapshot{Metadata: meta})
}
