package apply

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/node"
)

// progress records the applied index the applier reports.
type progress struct{ last atomic.Uint64 }

func (p *progress) Applied(index uint64) { p.last.Store(index) }

// installerFunc is an Installer that calls itself.
type installerFunc func(*raftpb.Snapshot) error

func (f installerFunc) Install(snap *raftpb.Snapshot) (*CatchUp, error) { return nil, f(snap) }
func (f installerFunc) Durable(uint64) error                            { return nil }

func openStore(t *testing.T, fs vfs.FS) (*pebbleengine.Engine, *mvcc.Store) {
	t.Helper()
	eng, err := pebbleengine.Open("engine", pebbleengine.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	store, err := mvcc.Open(eng, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return eng, store
}

func normal(t *testing.T, index uint64, req *pb.InternalRaftRequest) *raftpb.Entry {
	t.Helper()
	data, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return &raftpb.Entry{Index: proto.Uint64(index), Term: proto.Uint64(1), Type: raftpb.EntryNormal.Enum(), Data: data}
}

func confChange(t *testing.T, index uint64, reqID uint64, typ raftpb.ConfChangeType, m *pb.Member) *raftpb.Entry {
	t.Helper()
	ctx, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	cc := &raftpb.ConfChange{Id: proto.Uint64(reqID), Type: typ.Enum(), NodeId: proto.Uint64(m.ID), Context: ctx}
	data, err := proto.Marshal(cc)
	if err != nil {
		t.Fatal(err)
	}
	return &raftpb.Entry{Index: proto.Uint64(index), Term: proto.Uint64(1), Type: raftpb.EntryConfChange.Enum(), Data: data}
}

func put(id uint64, k, v string) *pb.InternalRaftRequest {
	return &pb.InternalRaftRequest{Header: &pb.RequestHeader{ID: id}, Put: &pb.PutRequest{Key: []byte(k), Value: []byte(v)}}
}

// The applier applies committed entries in order, answers each waiting
// request with its result once the batch is committed, keeps membership and
// conf state in the engine, and skips entries the engine already holds.
func TestApplyAnswersWaitersAndPersistsState(t *testing.T) {
	fs := vfs.NewMem()
	eng, store := openStore(t, fs)
	prog := &progress{}
	a, err := New(Config{Store: store, Progress: prog})
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan node.Committed, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, in) }()

	w1 := a.cfg.Waiters.Register(101)
	w2 := a.cfg.Waiters.Register(102)
	wcc := a.cfg.Waiters.Register(103)
	cs := &raftpb.ConfState{Voters: []uint64{7}}
	in <- node.Committed{
		Entries: []*raftpb.Entry{
			confChange(t, 1, 103, raftpb.ConfChangeAddNode, &pb.Member{ID: 7, PeerURLs: []string{"http://p:1"}}),
			{Index: proto.Uint64(2), Term: proto.Uint64(2), Type: raftpb.EntryNormal.Enum()}, // a leader's empty entry
			normal(t, 3, put(101, "a", "1")),
		},
		ConfStates: map[uint64]*raftpb.ConfState{1: cs},
	}
	in <- node.Committed{Entries: []*raftpb.Entry{
		normal(t, 4, put(102, "a", "2")),
		// A put with a lease that does not exist: refused by the state
		// machine, identically on every member, without stopping the applier.
		normal(t, 5, &pb.InternalRaftRequest{Header: &pb.RequestHeader{ID: 104}, Put: &pb.PutRequest{Key: []byte("b"), Lease: 9}}),
	}}
	for _, tc := range []struct {
		name string
		c    <-chan Result
		rev  int64
	}{
		{"first put", w1, 2},
		{"second put", w2, 3},
	} {
		select {
		case res := <-tc.c:
			if res.Err != nil {
				t.Fatalf("%s: %v", tc.name, res.Err)
			}
			if got := res.Response.(*pb.PutResponse).Header.Revision; got != tc.rev {
				t.Fatalf("%s: revision %d, want %d", tc.name, got, tc.rev)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no answer", tc.name)
		}
	}
	select {
	case <-wcc:
	case <-time.After(5 * time.Second):
		t.Fatal("conf change: no answer")
	}
	if err := a.WaitApplied(context.Background(), 5); err != nil {
		t.Fatal(err)
	}
	if got := a.Members(); len(got) != 1 || got[0].ID != 7 {
		t.Fatalf("members = %v", got)
	}
	// Redelivered entries (index <= applied) change nothing.
	in <- node.Committed{Entries: []*raftpb.Entry{normal(t, 4, put(0, "a", "redelivered"))}}
	in <- node.Committed{Entries: []*raftpb.Entry{normal(t, 6, put(0, "c", "3"))}}
	if err := a.WaitApplied(context.Background(), 6); err != nil {
		t.Fatal(err)
	}
	resp, err := store.Range(&pb.RangeRequest{Key: []byte("a")})
	if err != nil {
		t.Fatal(err)
	}
	if string(resp.Kvs[0].Value) != "2" || resp.Kvs[0].ModRevision != 3 {
		t.Fatalf("a = %q at %d, want 2 at 3", resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
	}
	// Progress is reported right after the waiters are released.
	for deadline := time.Now().Add(5 * time.Second); prog.last.Load() != 6; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("progress reported %d, want 6", prog.last.Load())
		}
	}
	// Each commit's outcome is reported after its waiters are released:
	// the applied index, and the member list where it changed (the first
	// batch's conf change).
	var outcomes []Outcome
	for len(outcomes) == 0 || outcomes[len(outcomes)-1].Applied != 6 {
		select {
		case o := <-a.Outcomes():
			outcomes = append(outcomes, o)
		case <-time.After(5 * time.Second):
			t.Fatalf("outcomes %+v, want the last at index 6", outcomes)
		}
	}
	if o := outcomes[0]; len(o.Members) != 1 || o.Members[0].ID != 7 || o.Installed {
		t.Fatalf("first outcome %+v, want the new member list with member 7", o)
	}
	for _, o := range outcomes[1:] {
		if o.Members != nil {
			t.Fatalf("outcome %+v reports a membership change; none happened after the first batch", o)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Everything the applier keeps comes back from the engine.
	if err := eng.Flush(); err != nil {
		t.Fatal(err)
	}
	store.Close()
	eng.Close()
	_, store2 := openStore(t, fs)
	a2, err := New(Config{Store: store2})
	if err != nil {
		t.Fatal(err)
	}
	if a2.AppliedIndex() != 6 {
		t.Fatalf("applied index after reopen %d, want 6", a2.AppliedIndex())
	}
	if got := a2.ConfState(); got == nil || len(got.GetVoters()) != 1 || got.GetVoters()[0] != 7 {
		t.Fatalf("conf state after reopen %v", got)
	}
	if got := a2.Members(); len(got) != 1 || got[0].PeerURLs[0] != "http://p:1" {
		t.Fatalf("members after reopen %v", got)
	}
}

// An engine that applied entries but lost its conf state (and member list)
// gets them back from the membership entries raft redelivers
// (node.raftAppliedIndex has raft replay the log from its snapshot point
// then): written back at the index the engine holds, without applying
// anything else twice.
func TestRedeliveredMembershipRestoresLostConfState(t *testing.T) {
	for _, tc := range []struct {
		name        string
		keepMembers bool // only the conf state was lost
	}{
		{name: "conf state and members lost"},
		{name: "conf state lost", keepMembers: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			eng, store := openStore(t, fs)
			m7 := &pb.Member{ID: 7, Name: "seven", PeerURLs: []string{"http://p:1"}}
			// The engine at applied index 3: entries 2 and 3 put a key,
			// entry 1 added member 7, and its conf state is gone.
			w := store.Write(nil)
			for _, r := range []*pb.PutRequest{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("a"), Value: []byte("2")}} {
				if _, err := w.Put(r); err != nil {
					t.Fatal(err)
				}
			}
			if tc.keepMembers {
				raw, err := proto.Marshal(&pb.MemberListResponse{Members: []*pb.Member{m7}})
				if err != nil {
					t.Fatal(err)
				}
				if err := w.SetMeta(metaMembers, raw); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Commit(3); err != nil {
				t.Fatal(err)
			}
			a, err := New(Config{Store: store})
			if err != nil {
				t.Fatal(err)
			}
			if a.ConfState() != nil {
				t.Fatal("the test engine holds a conf state")
			}
			in := make(chan node.Committed, 4)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx, in) }()
			cs := &raftpb.ConfState{Voters: []uint64{7}}
			in <- node.Committed{
				Entries: []*raftpb.Entry{
					confChange(t, 1, 0, raftpb.ConfChangeAddNode, &pb.Member{ID: 7, PeerURLs: []string{"http://p:1"}}),
					normal(t, 2, put(0, "a", "1")),
					normal(t, 3, put(0, "a", "2")),
				},
				ConfStates: map[uint64]*raftpb.ConfState{1: cs},
			}
			for deadline := time.Now().Add(5 * time.Second); a.ConfState() == nil; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the redelivered membership entry did not restore the conf state")
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := store.Rev(); got != 3 {
				t.Fatalf("revision %d after the redelivery, want 3: redelivered puts were applied again", got)
			}
			if err := eng.Flush(); err != nil {
				t.Fatal(err)
			}
			store.Close()
			eng.Close()
			_, store2 := openStore(t, fs)
			a2, err := New(Config{Store: store2})
			if err != nil {
				t.Fatal(err)
			}
			if a2.AppliedIndex() != 3 {
				t.Fatalf("applied index after reopen %d, want 3", a2.AppliedIndex())
			}
			if got := a2.ConfState(); got == nil || len(got.GetVoters()) != 1 || got.GetVoters()[0] != 7 {
				t.Fatalf("conf state after reopen %v, want voters [7]", got)
			}
			wantName := ""
			if tc.keepMembers {
				wantName = "seven" // the kept list is not rebuilt
			}
			if got := a2.Members(); len(got) != 1 || got[0].ID != 7 || got[0].Name != wantName {
				t.Fatalf("members after reopen %v, want member 7 named %q", got, wantName)
			}
		})
	}
}

// TestInstallAnswersWaitingClients: a snapshot install covers entries it
// never applies through the request path, and the entries redelivered
// after it are skipped, so clients waiting when it starts must get an
// answer at once -- their result if the install applied their entry,
// ErrOutcomeUnknown otherwise -- instead of waiting until their deadline
// (issue 10 finding 7). A client registered during the install is left
// waiting for its entry.
func TestInstallAnswersWaitingClients(t *testing.T) {
	_, store := openStore(t, vfs.NewMem())
	waiters := NewWaiters()
	covered := waiters.Register(1)
	var during <-chan Result
	a, err := New(Config{Store: store, Waiters: waiters, Installer: installerFunc(func(*raftpb.Snapshot) error {
		during = waiters.Register(2)
		return nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	installed := make(chan error, 1)
	in := make(chan node.Committed, 1)
	in <- node.Committed{Snapshot: &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(5)}}, Installed: installed}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, in) }()
	defer func() { cancel(); <-done }()
	if err := <-installed; err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-covered:
		if !errors.Is(res.Err, ErrOutcomeUnknown) {
			t.Fatalf("a client waiting at the install got %+v, want ErrOutcomeUnknown", res)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a client waiting when the install started got no answer")
	}
	select {
	case res := <-during:
		t.Fatalf("a client registered during the install was answered %+v before its entry applied", res)
	default:
	}
}
