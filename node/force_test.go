package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// confEntry is a version-1 membership entry.
func confEntry(t *testing.T, index, term uint64, typ raftpb.ConfChangeType, id uint64) *raftpb.Entry {
	t.Helper()
	data, err := proto.Marshal(&raftpb.ConfChange{Type: typ.Enum(), NodeId: proto.Uint64(id)})
	if err != nil {
		t.Fatal(err)
	}
	return &raftpb.Entry{Index: proto.Uint64(index), Term: proto.Uint64(term), Type: raftpb.EntryConfChange.Enum(), Data: data}
}

func normalEntry(index, term uint64) *raftpb.Entry {
	return &raftpb.Entry{Index: proto.Uint64(index), Term: proto.Uint64(term), Type: raftpb.EntryNormal.Enum(),
		Data: fmt.Appendf(nil, "v%d", index)}
}

// describeLog renders entries first..last of log as "index/term what".
func describeLog(t *testing.T, log *memLog) []string {
	t.Helper()
	first, _ := log.FirstIndex()
	last, _ := log.LastIndex()
	if last < first {
		return nil
	}
	ents, err := log.Entries(first, last+1, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		what := string(e.GetData())
		if e.GetType() == raftpb.EntryConfChange {
			var cc raftpb.ConfChange
			if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
				t.Fatal(err)
			}
			what = fmt.Sprintf("%s %d", cc.GetType(), cc.GetNodeId())
		} else if what == "" {
			what = "empty"
		}
		out = append(out, fmt.Sprintf("%d/%d %s", e.GetIndex(), e.GetTerm(), what))
	}
	return out
}

// TestForceNewClusterRewritesTheLog checks what New writes to the log under
// ForceNewCluster, before raft runs (force.go's numbered steps): every
// entry is kept and taken as committed, whatever commit index the log
// records and whatever the engine applied, and one removal per other
// member (voters and learners, as raft's membership at the last index has
// them) is appended in the HardState's term and recorded as committed.
func TestForceNewClusterRewritesTheLog(t *testing.T) {
	// A cluster of voters 1, 2, 3 and learner 4 (indexes 1-4), with normal
	// entries 5-10 in term 2; the HardState is in term 3.
	base := func(t *testing.T) []*raftpb.Entry {
		ents := []*raftpb.Entry{
			confEntry(t, 1, 1, raftpb.ConfChangeAddNode, 1),
			confEntry(t, 2, 1, raftpb.ConfChangeAddNode, 2),
			confEntry(t, 3, 1, raftpb.ConfChangeAddNode, 3),
			confEntry(t, 4, 1, raftpb.ConfChangeAddLearnerNode, 4),
		}
		for i := uint64(5); i <= 10; i++ {
			ents = append(ents, normalEntry(i, 2))
		}
		return ents
	}
	alone := func(t *testing.T) []*raftpb.Entry {
		ents := []*raftpb.Entry{confEntry(t, 1, 1, raftpb.ConfChangeAddNode, 1)}
		for i := uint64(2); i <= 10; i++ {
			ents = append(ents, normalEntry(i, 2))
		}
		return ents
	}
	all := &raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}}
	kept := []string{"7/2 v7", "8/2 v8", "9/2 v9", "10/2 v10"}
	removeAll := []string{"11/3 ConfChangeRemoveNode 2", "12/3 ConfChangeRemoveNode 3", "13/3 ConfChangeRemoveNode 4"}
	for _, tc := range []struct {
		name      string
		entries   func(t *testing.T) []*raftpb.Entry
		logCommit uint64
		applied   uint64
		confState *raftpb.ConfState
		want      []string // the log's entries from index 7 on
		wantHS    string
	}{
		{
			name: "entries past the commit index and the applied index are kept", entries: base, logCommit: 7, applied: 6, confState: all,
			want: append(slices.Clone(kept), removeAll...), wantHS: "Term:3 Vote:1 Commit:13",
		},
		{
			name: "applied past the commit the log records", entries: base, logCommit: 7, applied: 9, confState: all,
			want: append(slices.Clone(kept), removeAll...), wantHS: "Term:3 Vote:1 Commit:13",
		},
		{
			name: "membership from the log's entries, the engine holding none", entries: base, logCommit: 10, applied: 0,
			want: append(slices.Clone(kept), removeAll...), wantHS: "Term:3 Vote:1 Commit:13",
		},
		{
			name: "a member removed in the log is not removed again",
			entries: func(t *testing.T) []*raftpb.Entry {
				ents := base(t)
				ents[5] = confEntry(t, 6, 2, raftpb.ConfChangeRemoveNode, 3)
				return ents
			},
			logCommit: 8, applied: 4, confState: all,
			want:   append(slices.Clone(kept), "11/3 ConfChangeRemoveNode 2", "12/3 ConfChangeRemoveNode 4"),
			wantHS: "Term:3 Vote:1 Commit:12",
		},
		{
			name: "a membership change past the log's commit index counts, as it is committed now",
			entries: func(t *testing.T) []*raftpb.Entry {
				ents := base(t)
				ents[8] = confEntry(t, 9, 2, raftpb.ConfChangeRemoveNode, 2)
				return ents
			},
			logCommit: 8, applied: 8, confState: all,
			want:   []string{"7/2 v7", "8/2 v8", "9/2 ConfChangeRemoveNode 2", "10/2 v10", "11/3 ConfChangeRemoveNode 3", "12/3 ConfChangeRemoveNode 4"},
			wantHS: "Term:3 Vote:1 Commit:12",
		},
		{
			name: "alone already: only the commit index is recorded", entries: alone,
			logCommit: 8, applied: 8, confState: &raftpb.ConfState{Voters: []uint64{1}},
			want: kept, wantHS: "Term:3 Vote:1 Commit:10",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &memLog{MemoryStorage: raft.NewMemoryStorage()}
			if err := log.Append(tc.entries(t), &raftpb.HardState{Term: proto.Uint64(3), Vote: proto.Uint64(1), Commit: proto.Uint64(tc.logCommit)}); err != nil {
				t.Fatal(err)
			}
			_, err := New(Config{ID: 1, Log: log, Applied: tc.applied, ConfState: tc.confState, ForceNewCluster: true,
				TickInterval: time.Hour, ElectionTicks: 10, HeartbeatTicks: 1, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			got := describeLog(t, log)
			if i := slices.IndexFunc(got, func(s string) bool { return strings.HasPrefix(s, "7/") }); i >= 0 {
				got = got[i:]
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("log from index 7:\n got %q\nwant %q", got, tc.want)
			}
			hs, _, _ := log.InitialState()
			if got := raft.DescribeHardState(hs); got != tc.wantHS {
				t.Errorf("HardState %s, want %s", got, tc.wantHS)
			}
		})
	}
}

// TestForceNewClusterRefuses: a member that is not a voter at the commit
// index, or whose state machine is past its log's end after a snapshot
// install, is refused with ErrForceNewCluster, and nothing is written.
func TestForceNewClusterRefuses(t *testing.T) {
	ents := []*raftpb.Entry{
		confEntry(t, 1, 1, raftpb.ConfChangeAddNode, 1),
		confEntry(t, 2, 1, raftpb.ConfChangeAddNode, 2),
		confEntry(t, 3, 1, raftpb.ConfChangeAddLearnerNode, 4),
		confEntry(t, 4, 1, raftpb.ConfChangeRemoveNode, 2),
	}
	for _, tc := range []struct {
		name    string
		id      uint64
		pending bool
		want    string
	}{
		{name: "a learner", id: 4, want: "member 4 is a learner at index 4"},
		{name: "a removed member", id: 2, want: "member 2 is not in its cluster's membership at index 4"},
		{name: "an unknown member", id: 9, want: "member 9 is not in its cluster's membership at index 4"},
		{name: "an engine past the log after an install", id: 1, pending: true, want: "past the raft log's last entry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &memLog{MemoryStorage: raft.NewMemoryStorage()}
			if err := log.Append(ents, &raftpb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(4)}); err != nil {
				t.Fatal(err)
			}
			applied := uint64(4)
			if tc.pending {
				// The engine took a snapshot at 10; the log was never
				// restarted after it (reconcileSnapshot keeps the record).
				applied = 12
				log.pending = &raftpb.SnapshotMetadata{Index: proto.Uint64(3), Term: proto.Uint64(1),
					ConfState: &raftpb.ConfState{Voters: []uint64{1, 2}}}
			}
			_, err := New(Config{ID: tc.id, Log: log, Applied: applied, ForceNewCluster: true,
				TickInterval: time.Hour, ElectionTicks: 10, HeartbeatTicks: 1, Logger: testLogger(t)})
			if !errors.Is(err, ErrForceNewCluster) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want ErrForceNewCluster with %q", err, tc.want)
			}
			// After an install, start-up restarted the log after the
			// snapshot (reconcileSnapshot), before the refusal.
			wantLast := uint64(4)
			if tc.pending {
				wantLast = 3
			}
			if last, _ := log.LastIndex(); last != wantLast {
				t.Errorf("refused, yet the log's last index is %d, want %d", last, wantLast)
			}
			if hs, _, _ := log.InitialState(); hs.GetCommit() != 4 {
				t.Errorf("refused, yet the log's commit is %d, want 4", hs.GetCommit())
			}
		})
	}
}

// TestForceNewClusterIgnoredOnEmptyLog: as etcd without a WAL, a member
// with nothing in its log bootstraps from its peers as if the flag were
// not given.
func TestForceNewClusterIgnoredOnEmptyLog(t *testing.T) {
	log := &memLog{MemoryStorage: raft.NewMemoryStorage()}
	n, _ := runNode(t, Config{ID: 1, Peers: []raft.Peer{{ID: 1}, {ID: 2}}, Log: log, ForceNewCluster: true,
		TickInterval: time.Hour, ElectionTicks: 10, HeartbeatTicks: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := n.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Config.Voters.IDs(); len(got) != 2 {
		t.Fatalf("bootstrapped with voters %v, want the two peers", got)
	}
}

// TestForceNewClusterServesAlone runs a forced member: it becomes leader
// with nobody else, applies every entry of its log, hands the removals to
// the applier with conf states
// that end in itself alone, commits a proposal, and, restarted on the same
// log without the flag, is still a cluster of one.
func TestForceNewClusterServesAlone(t *testing.T) {
	log := &memLog{MemoryStorage: raft.NewMemoryStorage()}
	ents := []*raftpb.Entry{
		confEntry(t, 1, 1, raftpb.ConfChangeAddNode, 1),
		confEntry(t, 2, 1, raftpb.ConfChangeAddNode, 2),
		confEntry(t, 3, 1, raftpb.ConfChangeAddNode, 3),
		normalEntry(4, 2), normalEntry(5, 2),
	}
	// Entry 5 is past the commit index the log records: taken as
	// committed, it is applied.
	if err := log.Append(ents, &raftpb.HardState{Term: proto.Uint64(2), Vote: proto.Uint64(2), Commit: proto.Uint64(4)}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{ID: 1, Log: log, Applied: 3, ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}, ForceNewCluster: true,
		TickInterval: time.Millisecond, ElectionTicks: 10, HeartbeatTicks: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, seen, stop := runStoppableNode(t, cfg)
	if err := n.WaitLeader(ctx); err != nil {
		t.Fatalf("the forced member never became leader: %v", err)
	}
	if err := n.Propose(ctx, []byte("after")); err != nil {
		t.Fatalf("propose on the forced member: %v", err)
	}
	var applied []string
	var lastCS *raftpb.ConfState
	for !slices.Contains(applied, "after") {
		select {
		case c := <-seen:
			for _, e := range c.Entries {
				if cs := c.ConfStates[e.GetIndex()]; cs != nil {
					lastCS = cs
				}
				if e.GetType() == raftpb.EntryNormal && len(e.GetData()) > 0 {
					applied = append(applied, string(e.GetData()))
				}
			}
		case <-ctx.Done():
			t.Fatalf("the proposal was not applied; applied %q", applied)
		}
	}
	if want := []string{"v4", "v5", "after"}; !slices.Equal(applied, want) {
		t.Errorf("applied %q, want %q", applied, want)
	}
	if got := raft.DescribeConfState(lastCS); got != raft.DescribeConfState(&raftpb.ConfState{Voters: []uint64{1}, AutoLeave: proto.Bool(false)}) {
		t.Errorf("conf state handed to the applier after the removals: %s, want voter 1 alone", got)
	}
	st, err := n.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Config.Voters.IDs(); len(got) != 1 || st.RaftState != raft.StateLeader {
		t.Fatalf("raft: %v with voters %v, want leader alone", st.RaftState, got)
	}
	stop()

	// Restarted without the flag, from an engine that holds nothing (the
	// hardest case: raft learns the membership from the log again).
	cfg.ForceNewCluster, cfg.Applied, cfg.ConfState = false, 0, nil
	n2, _ := runNode(t, cfg)
	if err := n2.WaitLeader(ctx); err != nil {
		t.Fatalf("restarted without the flag: no leader: %v", err)
	}
	st, err = n2.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Config.Voters.IDs(); len(got) != 1 {
		t.Fatalf("restarted without the flag: voters %v, want 1 alone", got)
	}
	if err := n2.Propose(ctx, []byte("again")); err != nil {
		t.Fatalf("propose after restart: %v", err)
	}
}

// runStoppableNode is runNode with a stop function that ends the node and
// its applier loop and waits for both, so that the log may be reopened.
func runStoppableNode(t *testing.T, cfg Config) (*Node, <-chan Committed, func()) {
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
	stop := func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return n, seen, stop
}
