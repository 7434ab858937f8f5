package propose

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/node"
)

// fakeRaft records what is proposed and, if answer is set, answers each
// request through the waiters as an applier would.
type fakeRaft struct {
	waiters  *apply.Waiters
	answer   func(*pb.InternalRaftRequest) apply.Result
	proposed []*pb.InternalRaftRequest
	err      error
	ticking  bool // Ticking's answer
	reads    int  // ReadIndex calls
}

func (f *fakeRaft) Propose(_ context.Context, data []byte) error {
	if f.err != nil {
		return f.err
	}
	var req pb.InternalRaftRequest
	if err := proto.Unmarshal(data, &req); err != nil {
		return err
	}
	f.proposed = append(f.proposed, &req)
	if f.answer != nil {
		go f.waiters.Answer(req.Header.ID, f.answer(&req))
	}
	return nil
}

func (f *fakeRaft) ProposeConfChange(context.Context, raftpb.ConfChangeI) error { return f.err }
func (f *fakeRaft) Leader() uint64                                              { return 1 }
func (f *fakeRaft) Ticking() bool                                               { return f.ticking }

func (f *fakeRaft) ReadIndex(context.Context) (uint64, error) {
	f.reads++
	return 0, f.err
}

// TestEnsureLeader: etcd's ensureLeadership. While raft's loop ticks, the
// leader acts alone at once; after a stall it first confirms its
// leadership with a read-index round, and a failed round refuses.
func TestEnsureLeader(t *testing.T) {
	errLost := errors.New("no quorum answered")
	for _, tc := range []struct {
		name      string
		memberID  uint64 // fakeRaft's leader is 1
		ticking   bool
		readErr   error
		wantErr   error
		wantReads int
	}{
		{name: "ticking leader", memberID: 1, ticking: true},
		{name: "stalled leader, confirmed", memberID: 1, wantReads: 1},
		{name: "stalled leader, not confirmed", memberID: 1, readErr: errLost, wantErr: errLost, wantReads: 1},
		{name: "follower", memberID: 2, ticking: true, wantErr: ErrNotLeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raft := &fakeRaft{ticking: tc.ticking, err: tc.readErr}
			p := New(Config{MemberID: tc.memberID, Raft: raft, Waiters: apply.NewWaiters(), Stopped: make(chan struct{})})
			if err := p.EnsureLeader(context.Background()); !errors.Is(err, tc.wantErr) {
				t.Fatalf("EnsureLeader: %v, want %v", err, tc.wantErr)
			}
			if raft.reads != tc.wantReads {
				t.Fatalf("%d read-index rounds, want %d", raft.reads, tc.wantReads)
			}
		})
	}
}

// alarms is an applier's alarm list.
type alarms []*pb.AlarmMember

func (a alarms) List() []*pb.AlarmMember { return a }

func TestPropose(t *testing.T) {
	errRaft := errors.New("no leader")
	errApplied := errors.New("lease not found")
	for _, tc := range []struct {
		name     string
		quota    *Quota
		raftErr  error
		answer   func(*pb.InternalRaftRequest) apply.Result
		ctx      func() (context.Context, context.CancelFunc)
		wantErr  error // from Propose
		wantRes  error // the result's Err
		proposed int
	}{
		{name: "answered", answer: func(*pb.InternalRaftRequest) apply.Result { return apply.Result{} }, proposed: 1},
		{name: "refused by the state machine", answer: func(*pb.InternalRaftRequest) apply.Result { return apply.Result{Err: errApplied} }, wantRes: errApplied, proposed: 1},
		// Over the quota: refused with etcd's error, and the NOSPACE alarm
		// is proposed (the one proposal that reaches raft).
		{name: "over the quota", quota: &Quota{Bytes: 100, DiskSize: func() int64 { return 90 }, Alarms: alarms{}, Logger: zap.NewNop()},
			answer: func(*pb.InternalRaftRequest) apply.Result { return apply.Result{} }, wantErr: rpctypes.ErrGRPCNoSpace, proposed: 1},
		// The alarm raised already: refused without proposing it again.
		{name: "over the quota, alarm raised", quota: &Quota{Bytes: 100, DiskSize: func() int64 { return 90 },
			Alarms: alarms{{MemberID: 0xabcd, Alarm: pb.AlarmType_NOSPACE}}, Logger: zap.NewNop()}, wantErr: rpctypes.ErrGRPCNoSpace},
		{name: "under the quota", quota: &Quota{Bytes: 1000, DiskSize: func() int64 { return 90 }, Alarms: alarms{}, Logger: zap.NewNop()},
			answer: func(*pb.InternalRaftRequest) apply.Result { return apply.Result{} }, proposed: 1},
		{name: "not taken by raft", raftErr: errRaft, wantErr: errRaft},
		{name: "caller gives up", ctx: func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 10*time.Millisecond)
		}, wantErr: context.DeadlineExceeded, proposed: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			waiters := apply.NewWaiters()
			raft := &fakeRaft{waiters: waiters, answer: tc.answer, err: tc.raftErr}
			p := New(Config{MemberID: 0xabcd, Raft: raft, Waiters: waiters, Quota: tc.quota, Stopped: make(chan struct{})})
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if tc.ctx != nil {
				ctx, cancel = tc.ctx()
			}
			defer cancel()
			res, err := p.Propose(ctx, &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte("k")}})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Propose error %v, want %v", err, tc.wantErr)
			}
			if !errors.Is(res.Err, tc.wantRes) {
				t.Fatalf("result error %v, want %v", res.Err, tc.wantRes)
			}
			if len(raft.proposed) != tc.proposed {
				t.Fatalf("%d proposals reached raft, want %d", len(raft.proposed), tc.proposed)
			}
			if tc.wantRes != nil {
				if err := p.Submit(ctx, &pb.InternalRaftRequest{}); !errors.Is(err, tc.wantRes) {
					t.Fatalf("Submit returned %v, want the state machine's %v", err, tc.wantRes)
				}
			}
		})
	}
}

// Request IDs carry the member's low 16 bits on top and never repeat; the
// header carries the caller the server authenticated.
func TestProposeHeader(t *testing.T) {
	waiters := apply.NewWaiters()
	raft := &fakeRaft{waiters: waiters, answer: func(*pb.InternalRaftRequest) apply.Result { return apply.Result{} }}
	p := New(Config{MemberID: 0x1234_0000_0000_abcd, Raft: raft, Waiters: waiters, Stopped: make(chan struct{})})
	ctx := auth.NewContext(context.Background(), &auth.Info{Username: "alice", Revision: 7})
	seen := map[uint64]bool{}
	for range 100 {
		if _, err := p.Propose(ctx, &pb.InternalRaftRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, req := range raft.proposed {
		h := req.Header
		if h.ID>>48 != 0xabcd || seen[h.ID] {
			t.Fatalf("request ID %x: want the member's low 16 bits on top, unique", h.ID)
		}
		seen[h.ID] = true
		if h.Username != "alice" || h.AuthRevision != 7 {
			t.Fatalf("header %+v, want the caller alice at auth revision 7", h)
		}
	}
}

// A proposal waiting when the member stops returns node.ErrStopped.
func TestProposeStopped(t *testing.T) {
	stopped := make(chan struct{})
	close(stopped)
	p := New(Config{Raft: &fakeRaft{}, Waiters: apply.NewWaiters(), Stopped: stopped})
	if _, err := p.Propose(context.Background(), &pb.InternalRaftRequest{}); !errors.Is(err, node.ErrStopped) {
		t.Fatalf("Propose on a stopped member returned %v, want node.ErrStopped", err)
	}
}
