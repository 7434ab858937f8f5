package server

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/mvcc"
)

// Local is the Backend of a member serving its own components: requests are
// proposed through its proposer, reads wait on its raft node and applier,
// and the store it answers from is its own. The member builds one from the
// components it opened; nothing in it is set later.
type Local struct {
	// ID is this member's ID and Cluster its cluster's: they fill
	// response headers.
	ID, Cluster uint64
	// Proposer replicates requests (propose.Proposer).
	Proposer interface {
		Propose(ctx context.Context, req *pb.InternalRaftRequest) (apply.Result, error)
	}
	// Raft is the member's raft node (node.Node).
	Raft interface {
		ReadIndex(ctx context.Context) (uint64, error)
		Term() uint64
		Leader() uint64
		CommitIndex() uint64
	}
	// Applier is the member's state machine applier (apply.Applier).
	Applier interface {
		WaitApplied(ctx context.Context, index uint64) error
		AppliedIndex() uint64
		Members() []*pb.Member
	}
	// StateMachine is the store reads are answered from.
	StateMachine *mvcc.Store
	// Engine reports the data's size on disk for Status.
	Engine interface{ DiskSize() int64 }
}

var _ Backend = (*Local)(nil)

// Propose implements Backend.
func (l *Local) Propose(ctx context.Context, req *pb.InternalRaftRequest) (apply.Result, error) {
	return l.Proposer.Propose(ctx, req)
}

// ReadBarrier implements Backend: raft's ReadIndex gives the commit index a
// leader confirmed, and the barrier holds until the applier has reached it.
func (l *Local) ReadBarrier(ctx context.Context) error {
	idx, err := l.Raft.ReadIndex(ctx)
	if err != nil {
		return err
	}
	return l.Applier.WaitApplied(ctx, idx)
}

// Store implements Backend.
func (l *Local) Store() *mvcc.Store { return l.StateMachine }

// ClusterID implements Backend.
func (l *Local) ClusterID() uint64 { return l.Cluster }

// MemberID implements Backend.
func (l *Local) MemberID() uint64 { return l.ID }

// Term implements Backend.
func (l *Local) Term() uint64 { return l.Raft.Term() }

// Leader implements Backend.
func (l *Local) Leader() uint64 { return l.Raft.Leader() }

// Members implements Backend.
func (l *Local) Members() []*pb.Member { return l.Applier.Members() }

// Status implements Backend. IsLearner is this member's record in the
// applied member list, as etcd's Status reports it.
func (l *Local) Status() Status {
	st := Status{
		CommitIndex:  l.Raft.CommitIndex(),
		AppliedIndex: l.Applier.AppliedIndex(),
		DBSize:       l.Engine.DiskSize(),
	}
	for _, m := range l.Applier.Members() {
		if m.ID == l.ID {
			st.IsLearner = m.IsLearner
		}
	}
	return st
}
