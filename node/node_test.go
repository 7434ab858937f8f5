package node

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/protobuf/proto"
)

// memLog is a raft log in memory: the node is tested alone, against the
// interface the real log implements (raftlog has its own tests).
type memLog struct {
	*raft.MemoryStorage
	mu        sync.Mutex
	appends   int // appends that carried entries
	compacted uint64
	pending   *raftpb.SnapshotMetadata
	// compactions, if set, is told every index the log is compacted to.
	compactions chan uint64
}

func (l *memLog) BeginSnapshot(meta *raftpb.SnapshotMetadata) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = meta
	return nil
}

func (l *memLog) PendingSnapshot() *raftpb.SnapshotMetadata {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending
}

func (l *memLog) ForgetPendingSnapshot() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = nil
	return nil
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
	if err := l.MemoryStorage.Compact(index); err != nil {
		return err
	}
	if l.compactions != nil {
		select {
		case l.compactions <- index:
		default:
		}
	}
	return nil
}

// fakeEngine reports as durable whatever the test says was applied.
type fakeEngine struct {
	mu       sync.Mutex
	applied  uint64
	durable  uint64
	flushes  []uint64 // the durable index after each Flush
	flushErr error    // if set, every Flush fails with it
}

func (e *fakeEngine) Flush() error {
	e.mu.Lock()
	if e.flushErr != nil {
		e.mu.Unlock()
		return e.flushErr
	}
	e.durable = e.applied
	e.flushes = append(e.flushes, e.durable)
	e.mu.Unlock()
	return nil
}

func (e *fakeEngine) DurableIndex() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.durable
}

// startNode runs a one-member node and an applier loop that records the
// data of every committed normal entry; the returned function waits
// (bounded) until at least n were applied and returns them all.
func startNode(t *testing.T, log *memLog, eng *fakeEngine, applied uint64, cs *raftpb.ConfState, snapshotCount uint64) (*Node, func(n int) []string) {
	t.Helper()
	var peers []raft.Peer
	if last, _ := log.LastIndex(); last == 0 {
		peers = []raft.Peer{{ID: 1}}
	}
	return startNodeConfig(t, Config{
		ID: 1, Peers: peers, Log: log, Applied: applied, ConfState: cs,
		TickInterval: time.Millisecond, ElectionTicks: 10, HeartbeatTicks: 1,
		SnapshotCount: snapshotCount, CatchUpEntries: 2,
	}, eng)
}

// startNodeConfig is startNode with the whole configuration given; the
// node's engine is eng, which the applier loop keeps told of what it
// applied.
func startNodeConfig(t *testing.T, cfg Config, eng *fakeEngine) (*Node, func(n int) []string) {
	t.Helper()
	cfg.Engine, cfg.Logger = eng, testLogger(t)
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var got []string
	appliedMore := make(chan struct{}, 1) // a batch was applied
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = n.Run(ctx) }()
	go func() {
		defer wg.Done()
		for {
			select {
			case c := <-n.Committed():
				if acceptChange(c) {
					continue
				}
				mu.Lock()
				for _, e := range c.Entries {
					if e.GetType() == raftpb.EntryNormal && len(e.GetData()) > 0 {
						got = append(got, string(e.GetData()))
					}
				}
				mu.Unlock()
				select {
				case appliedMore <- struct{}{}:
				default:
				}
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
	return n, func(want int) []string {
		timeout := time.After(10 * time.Second)
		for {
			mu.Lock()
			out := append([]string(nil), got...)
			mu.Unlock()
			if len(out) >= want {
				return out
			}
			select {
			case <-appliedMore:
			case <-timeout:
				return out
			}
		}
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
	entries := got(count)
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

func testLogger(t *testing.T) *zap.Logger { return zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)) }

func (l *memLog) ApplySnapshot(meta *raftpb.SnapshotMetadata) error {
	return l.MemoryStorage.ApplySnapshot(&raftpb.Snapshot{Metadata: meta})
}

// runNode runs a node with cfg (its log, IDs and timings set by the
// caller) and an applier loop that reports every batch as applied and
// sends it on the returned channel (buffered; batches beyond its room are
// not sent).
func runNode(t *testing.T, cfg Config) (*Node, <-chan Committed) {
	t.Helper()
	cfg.Logger = testLogger(t)
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	seen := make(chan Committed, 64)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = n.Run(ctx) }()
	go func() {
		defer wg.Done()
		for {
			select {
			case c := <-n.Committed():
				if c.Snapshot != nil {
					c.Installed <- nil
					continue
				}
				if acceptChange(c) {
					continue
				}
				select {
				case seen <- c:
				default:
				}
				n.Applied(c.Entries[len(c.Entries)-1].GetIndex())
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return n, seen
}

// logWithEntries returns a log holding, from index 1 at term 1, a
// membership entry adding each of voters, then normal entries up to last,
// all committed.
func logWithEntries(t *testing.T, voters []uint64, last uint64) *memLog {
	t.Helper()
	log := &memLog{MemoryStorage: raft.NewMemoryStorage()}
	var entries []*raftpb.Entry
	for i := uint64(1); i <= last; i++ {
		e := &raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(1), Type: raftpb.EntryNormal.Enum(), Data: []byte("x")}
		if int(i) <= len(voters) {
			cc, err := proto.Marshal(&raftpb.ConfChange{Type: raftpb.ConfChangeAddNode.Enum(), NodeId: proto.Uint64(voters[i-1])})
			if err != nil {
				t.Fatal(err)
			}
			e.Type, e.Data = raftpb.EntryConfChange.Enum(), cc
		}
		entries = append(entries, e)
	}
	if err := log.Append(entries, &raftpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(last)}); err != nil {
		t.Fatal(err)
	}
	return log
}

// A member restarted from an engine whose applied index is past the
// membership entries but which holds no conf state (so that raft does not
// redeliver those entries and cannot learn the membership from them) must
// still get its membership: without it raft has an empty configuration for
// good, never campaigns ("unpromotable") and drops every response from its
// peers (RawNode.Step refuses responses from members it does not know),
// ReadIndex answers included, so linearizable reads through it hang.
// The node has raft redeliver the log from its snapshot point instead, and
// hands the redelivered membership entries, with their conf states, to the
// applier.
func TestRestartWithoutConfStateRederivesIt(t *testing.T) {
	log := logWithEntries(t, []uint64{1}, 5)
	n, seen := runNode(t, Config{
		ID: 1, Log: log, Applied: 5, ConfState: nil,
		TickInterval: time.Millisecond, ElectionTicks: 10, HeartbeatTicks: 1,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.WaitLeader(ctx); err != nil {
		t.Fatalf("the only voter never became leader: %v", err)
	}
	for {
		select {
		case c := <-seen:
			if cs := c.ConfStates[1]; cs != nil {
				if got := cs.GetVoters(); len(got) != 1 || got[0] != 1 {
					t.Fatalf("redelivered membership entry 1 carries voters %v, want [1]", got)
				}
				return
			}
		case <-ctx.Done():
			t.Fatal("the membership entry at index 1 was not redelivered to the applier with its conf state")
		}
	}
}

// A restarted member of a three-voter cluster whose engine holds no conf
// state yet (nothing was flushed before a crash) is not a cluster of one:
// it must not start an election at start-up, before any election timeout.
// raft knows the membership here from the log's snapshot point; the ticker
// never fires, so any campaign comes from the start-up path.
func TestRestartedMemberOfThreeDoesNotCampaignAtOnce(t *testing.T) {
	log := &memLog{MemoryStorage: raft.NewMemoryStorage()}
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	if err := log.MemoryStorage.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
		Index: proto.Uint64(5), Term: proto.Uint64(1), ConfState: cs,
	}}); err != nil {
		t.Fatal(err)
	}
	if err := log.SetHardState(&raftpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(5)}); err != nil {
		t.Fatal(err)
	}
	n, _ := runNode(t, Config{
		ID: 1, Log: log, Applied: 0, ConfState: nil,
		TickInterval: time.Hour, ElectionTicks: 10, HeartbeatTicks: 1,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Status runs on the node goroutine, after its start-up steps.
	st, err := n.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.RaftState != raft.StateFollower {
		t.Fatalf("restarted member of %v is %v at start-up, want a follower waiting for the leader", cs.GetVoters(), st.RaftState)
	}
}

// A member restarted from an engine that holds no conf state, whose log
// holds no membership entry after its snapshot point (a new cluster's
// first entries were compacted long ago), must still know its membership
// for log truncation and for the snapshots it sends: the log's conf state
// at its snapshot point is the membership there. Without it the node's
// conf history stayed empty, the log was never truncated, and the
// snapshots it sent carried an empty ConfState that followers refuse
// (issue 10 finding 4).
func TestRestartWithoutConfStateAndNoMembershipEntryKeepsTruncating(t *testing.T) {
	log := &memLog{MemoryStorage: raft.NewMemoryStorage(), compactions: make(chan uint64, 64)}
	cs := &raftpb.ConfState{Voters: []uint64{1}}
	if err := log.MemoryStorage.ApplySnapshot(&raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
		Index: proto.Uint64(5), Term: proto.Uint64(1), ConfState: cs,
	}}); err != nil {
		t.Fatal(err)
	}
	var entries []*raftpb.Entry
	for i := uint64(6); i <= 10; i++ {
		entries = append(entries, &raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(1), Type: raftpb.EntryNormal.Enum(), Data: []byte("x")})
	}
	if err := log.Append(entries, &raftpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(10)}); err != nil {
		t.Fatal(err)
	}
	eng := &fakeEngine{applied: 10, durable: 10}
	n, _ := startNode(t, log, eng, 10, nil, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitLeader(ctx); err != nil {
		t.Fatalf("the only voter never became leader: %v", err)
	}
	c := proposeUntilCompacted(t, ctx, n, log, 5)
	snap, err := log.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.GetMetadata().GetConfState().GetVoters(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("log truncated to %d with conf state %v, want voters [1]", c, snap.GetMetadata().GetConfState())
	}
}

// TestRestartFinishesAnInterruptedInstall: a crash (or a stop) between the
// state machine taking a snapshot and the log restarting after it, or
// after the restart but before the log received the entries up to the
// engine's index (a full snapshot carries the leader's engine past the
// snapshot's index), left an engine past the log's last index, and
// start-up refused for good ("engine applied index ... past the log's last
// index"; issue 10 finding 3, and the second case found by
// TestPowerCutMixedCluster). With the install's record, start-up restarts
// the log after the snapshot if the engine took it, tells raft the log's
// snapshot point was applied when the engine is past the log's end, and
// keeps the record until the log catches up; a record of an install that
// never reached the engine, with the engine within the log, is dropped;
// without a record, an engine past the log's end is still refused.
func TestRestartFinishesAnInterruptedInstall(t *testing.T) {
	snapMeta := &raftpb.SnapshotMetadata{Index: proto.Uint64(20), Term: proto.Uint64(2),
		ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}}
	laterMeta := &raftpb.SnapshotMetadata{Index: proto.Uint64(40), Term: proto.Uint64(2),
		ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}}
	for _, tc := range []struct {
		name        string
		restarted   bool                     // the log was already restarted after snapMeta
		record      *raftpb.SnapshotMetadata // the record left, if any
		applied     uint64                   // the engine's applied index at start-up
		emptyLog    bool                     // the log holds nothing (another log directory)
		wantErr     string                   // New fails saying this
		wantSnap    uint64                   // the log's snapshot index after start-up
		wantApplied uint64                   // what raft is told was applied
		wantRecord  bool                     // the record is kept
	}{
		{name: "crash before the log restarted, engine at the snapshot", record: snapMeta, applied: 20,
			wantSnap: 20, wantApplied: 20},
		{name: "crash before the log restarted, engine past the snapshot", record: snapMeta, applied: 26,
			wantSnap: 20, wantApplied: 20, wantRecord: true},
		{name: "crash after the log restarted, engine past its end", restarted: true, record: snapMeta, applied: 26,
			wantSnap: 20, wantApplied: 20, wantRecord: true},
		{name: "a later install not in the engine, the earlier one past the log's end", restarted: true, record: laterMeta,
			applied: 26, wantSnap: 20, wantApplied: 20, wantRecord: true},
		{name: "install not in the engine", record: snapMeta, applied: 10, wantSnap: 0, wantApplied: 10},
		{name: "no record, engine past the log", applied: 26, wantErr: "the log lost synced entries"},
		{name: "empty log, engine applied", applied: 26, emptyLog: true, wantErr: "the raft log is empty: is this the log directory (--log-dir, --wal-dir)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := logWithEntries(t, []uint64{1, 2, 3}, 10)
			if tc.emptyLog {
				log = &memLog{MemoryStorage: raft.NewMemoryStorage()}
			}
			if tc.restarted {
				if err := log.ApplySnapshot(snapMeta); err != nil {
					t.Fatal(err)
				}
			}
			if tc.record != nil {
				if err := log.BeginSnapshot(tc.record); err != nil {
					t.Fatal(err)
				}
			}
			cfg := Config{
				ID: 1, Log: log, Applied: tc.applied, ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}},
				TickInterval: time.Hour, ElectionTicks: 10, HeartbeatTicks: 1,
			}
			if tc.wantErr != "" {
				cfg.Logger = testLogger(t)
				if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New of an engine past the log's last index with no snapshot record: %v, want an error saying %q", err, tc.wantErr)
				}
				return
			}
			n, _ := runNode(t, cfg)
			if got := log.PendingSnapshot() != nil; got != tc.wantRecord {
				t.Fatalf("record kept %v after start-up, want %v", got, tc.wantRecord)
			}
			if snap, _ := log.Snapshot(); snap.GetMetadata().GetIndex() != tc.wantSnap {
				t.Fatalf("log's snapshot index %d, want %d", snap.GetMetadata().GetIndex(), tc.wantSnap)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			st, err := n.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Applied != tc.wantApplied || st.GetCommit() < tc.wantApplied {
				t.Fatalf("raft applied %d, commit %d; want applied %d", st.Applied, st.GetCommit(), tc.wantApplied)
			}
		})
	}
}

// TestCompactLogStaysWithinTheLog: after a snapshot install the engine may
// be past the log's last index (a full snapshot carries the leader's engine
// at its applied index, past the snapshot's), so its durable index is too;
// log truncation must stop at the log's last index instead of asking the
// log to compact past it, which failed the node (issue 10 finding 3).
func TestCompactLogStaysWithinTheLog(t *testing.T) {
	log := logWithEntries(t, []uint64{1}, 10)
	n, err := New(Config{
		ID: 1, Log: log, Applied: 10, ConfState: &raftpb.ConfState{Voters: []uint64{1}},
		TickInterval: time.Hour, ElectionTicks: 10, HeartbeatTicks: 1, CatchUpEntries: 2, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.compactLog(26); err != nil {
		t.Fatalf("compactLog with the engine durable past the log's end: %v", err)
	}
	if first, _ := log.FirstIndex(); first != 11 {
		t.Fatalf("log's first index %d after truncation, want 11 (the whole log)", first)
	}
}

// proposeUntilCompacted proposes 50 entries through n, whose snapshot count
// is 10, and waits (bounded) until log is compacted past above; it returns
// where the log was compacted to. log.compactions must be set.
func proposeUntilCompacted(t *testing.T, ctx context.Context, n *Node, log *memLog, above uint64) uint64 {
	t.Helper()
	for i := 0; i < 50; i++ {
		if err := n.Propose(ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case c := <-log.compactions:
			if c > above {
				return c
			}
		case <-timeout:
			t.Fatalf("log never compacted past %d after 50 entries with snapshot count 10", above)
		}
	}
}

// A member that copied committed entries into its log before starting
// (Config.MatchedIndex: --catch-up-logger) tells the first leader it
// hears, with a MsgAppResp for that index in the leader's term, ahead of
// its answer to the leader's heartbeat (the leader's progress for it may
// point below the leader's truncated log, and the heartbeat's answer alone
// would get it a snapshot); it tells only once.
func TestMatchedIndexToldToTheFirstLeader(t *testing.T) {
	log := logWithEntries(t, []uint64{1, 2, 3}, 10)
	n, _ := runNode(t, Config{
		ID: 2, Log: log, Applied: 10, ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}},
		TickInterval: time.Hour, ElectionTicks: 10, HeartbeatTicks: 1, MatchedIndex: 10,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	heartbeat := &raftpb.Message{Type: raftpb.MessageType_MsgHeartbeat.Enum(), From: proto.Uint64(1), To: proto.Uint64(2),
		Term: proto.Uint64(3), Commit: proto.Uint64(10)}
	next := func() []*raftpb.Message {
		t.Helper()
		select {
		case msgs := <-n.Outgoing():
			return msgs
		case <-ctx.Done():
			t.Fatal("no messages sent")
			return nil
		}
	}
	if err := n.Process(ctx, heartbeat); err != nil {
		t.Fatal(err)
	}
	msgs := next()
	if len(msgs) != 2 {
		t.Fatalf("answer to the first heartbeat: %v; want the MsgAppResp and the MsgHeartbeatResp", msgs)
	}
	if m := msgs[0]; m.GetType() != raftpb.MessageType_MsgAppResp || m.GetTo() != 1 || m.GetFrom() != 2 || m.GetTerm() != 3 ||
		m.GetIndex() != 10 || m.GetReject() {
		t.Errorf("first message %v; want MsgAppResp from 2 to 1 at term 3 for index 10", m)
	}
	if m := msgs[1]; m.GetType() != raftpb.MessageType_MsgHeartbeatResp {
		t.Errorf("second message %v; want the MsgHeartbeatResp", m)
	}
	if err := n.Process(ctx, heartbeat); err != nil {
		t.Fatal(err)
	}
	if msgs := next(); len(msgs) != 1 || msgs[0].GetType() != raftpb.MessageType_MsgHeartbeatResp {
		t.Errorf("answer to the second heartbeat: %v; want the MsgHeartbeatResp alone", msgs)
	}
}

// acceptChange answers c if it asks for a membership decision, as an
// applier that refuses no change, and reports whether it did.
func acceptChange(c Committed) bool {
	if c.Decide == nil {
		return false
	}
	c.Decision <- nil
	return true
}
