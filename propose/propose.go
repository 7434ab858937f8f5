// Package propose turns a request into a raft proposal and waits for its
// result: it is how the server's services, the lessor (lease expiry and
// checkpoints) and the auto-compactor change state. A proposal gets a
// request ID unique across members and restarts, carries its caller in the
// raft header (so that the applier checks a user's write against the
// permissions it has when the write applies), passes the space quota
// (quota.go), is registered with the applier's waiters, proposed to the
// node, and answered when the applier applies its entry.
//
// The path is one way: server, lessor or auto-compactor -> propose -> node;
// the answer comes back on the waiter's channel, not through a call.
package propose

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/node"
)

// Raft is what a proposer needs of the raft node.
type Raft interface {
	// Propose hands encoded data to raft; it returns once raft took it.
	Propose(ctx context.Context, data []byte) error
	// ProposeConfChange hands raft a membership change.
	ProposeConfChange(ctx context.Context, cc raftpb.ConfChangeI) error
	// Leader is the leader's member ID, 0 if none is known.
	Leader() uint64
	// ReadIndex confirms with a quorum that the leader this member knows
	// is still the leader, and returns the commit index then (raft's
	// ReadIndex).
	ReadIndex(ctx context.Context) (uint64, error)
	// Ticking reports whether raft's loop ticked within the last three
	// tick intervals (etcd's isActive).
	Ticking() bool
}

// Metrics counts proposals (server.Metrics); nil counts nothing.
type Metrics interface {
	// ProposalStarted counts a proposal and returns the function that
	// counts its end, with the error it ended with.
	ProposalStarted() func(error)
}

// Config is a proposer's collaborators.
type Config struct {
	// MemberID prefixes request IDs and tells the leader from the others.
	MemberID uint64
	Raft     Raft
	// LastIndex is the raft log's last index; Applied the state machine's
	// applied index (the lessor's promotion waits on both).
	LastIndex func() (uint64, error)
	Applied   interface{ AppliedIndex() uint64 }
	// Waiters is where the applier answers.
	Waiters *apply.Waiters
	// Quota, if not nil, refuses requests that would grow the store
	// beyond it (quota.go).
	Quota   *Quota
	Metrics Metrics
	// Stopped is closed when the member stops: waiting proposals return
	// node.ErrStopped.
	Stopped <-chan struct{}
}

// Proposer proposes requests and waits for their results. Safe for
// concurrent use.
type Proposer struct {
	cfg Config
	// lastID is the last request ID handed out; 0 until the first.
	lastID atomic.Uint64
	quota  quotaState
}

// New returns a proposer over cfg.
func New(cfg Config) *Proposer { return &Proposer{cfg: cfg} }

// Propose replicates req through raft and returns its applied result. The
// result's Err is the state machine's answer (a compacted revision, a
// missing lease); the returned error says the request did not get one
// (refused by the quota, not proposed, ctx ended, member stopped).
//
// Propose sets req's header. The caller must not change req from the
// call on, even after it returns: the applier may be reading it
// (Waiters.RegisterRequest).
func (p *Proposer) Propose(ctx context.Context, req *pb.InternalRaftRequest) (_ apply.Result, err error) {
	if p.cfg.Metrics != nil {
		done := p.cfg.Metrics.ProposalStarted()
		defer func() { done(err) }()
	}
	if err := p.admit(ctx, req); err != nil {
		return apply.Result{}, err
	}
	id := p.nextRequestID()
	req.Header = &pb.RequestHeader{ID: id}
	if info := auth.FromContext(ctx); info != nil {
		req.Header.Username, req.Header.AuthRevision = info.Username, info.Revision
	}
	data, err := proto.Marshal(req)
	if err != nil {
		return apply.Result{}, fmt.Errorf("encode request: %w", err)
	}
	// req is not changed after this: the applier may apply it in place of
	// the entry's bytes (Waiters.RegisterRequest).
	resc := p.cfg.Waiters.RegisterRequest(id, req, data)
	if err := p.cfg.Raft.Propose(ctx, data); err != nil {
		p.cfg.Waiters.Cancel(id)
		return apply.Result{}, err
	}
	select {
	case res := <-resc:
		return res, nil
	case <-ctx.Done():
		p.cfg.Waiters.Cancel(id)
		return apply.Result{}, ctx.Err()
	case <-p.cfg.Stopped:
		return apply.Result{}, node.ErrStopped
	}
}

// Submit is Propose for a caller that needs only whether the request
// took effect: the state machine's refusal is returned as the error. The
// lessor and the auto-compactor propose through it.
func (p *Proposer) Submit(ctx context.Context, req *pb.InternalRaftRequest) error {
	res, err := p.Propose(ctx, req)
	if err != nil {
		return err
	}
	return res.Err
}

// ProposeConfChange proposes a membership change, with a request ID it
// sets, and returns the channel on which the applier answers once the
// change is applied, and the function that forgets the request when the
// caller stops waiting (it must call one or the other to the end).
func (p *Proposer) ProposeConfChange(ctx context.Context, cc *raftpb.ConfChange) (<-chan apply.Result, func(), error) {
	id := p.nextRequestID()
	cc.Id = proto.Uint64(id)
	resc := p.cfg.Waiters.Register(id)
	forget := func() { p.cfg.Waiters.Cancel(id) }
	if err := p.cfg.Raft.ProposeConfChange(ctx, cc); err != nil {
		forget()
		return nil, nil, err
	}
	return resc, forget, nil
}

// IsLeader reports whether this member is the raft leader.
func (p *Proposer) IsLeader() bool { return p.cfg.Raft.Leader() == p.cfg.MemberID }

// ErrNotLeader is ConfirmLeader's answer when another member leads.
var ErrNotLeader = errors.New("propose: not the leader")

// EnsureLeader is etcd's ensureLeadership, for what a leader answers alone
// (a lease renewal): nil at once while raft's loop ticks, since a leader
// that keeps ticking has heard of any newer term; after a stall (a disk
// write that hung, a paused process) a read-index round (ConfirmLeader),
// which a quorum answers only to the current leader.
func (p *Proposer) EnsureLeader(ctx context.Context) error {
	if !p.IsLeader() {
		return ErrNotLeader
	}
	if p.cfg.Raft.Ticking() {
		return nil
	}
	return p.ConfirmLeader(ctx)
}

// ConfirmLeader returns nil if this member is the leader after a raft
// read-index round, which a quorum answers only to the current leader:
// a leader that was cut off or stalled while the others elected another
// learns it here (or times out) before it acts alone (lease expiry; etcd's
// ensureLeadership).
func (p *Proposer) ConfirmLeader(ctx context.Context) error {
	if !p.IsLeader() {
		return ErrNotLeader
	}
	if _, err := p.cfg.Raft.ReadIndex(ctx); err != nil {
		return fmt.Errorf("confirm leadership: %w", err)
	}
	if !p.IsLeader() {
		return ErrNotLeader
	}
	return nil
}

// LastIndex is the raft log's last index (0 if it cannot be read).
func (p *Proposer) LastIndex() uint64 {
	last, _ := p.cfg.LastIndex()
	return last
}

// AppliedIndex is the state machine's applied index.
func (p *Proposer) AppliedIndex() uint64 { return p.cfg.Applied.AppliedIndex() }

// nextRequestID returns IDs unique across members and restarts: the low
// 16 bits of the member ID on top, then the start-up time in milliseconds
// shifted left, incremented per request (etcd's idutil scheme).
func (p *Proposer) nextRequestID() uint64 {
	if p.lastID.Load() == 0 {
		prefix := (p.cfg.MemberID & 0xffff) << 48
		start := (uint64(time.Now().UnixMilli()) & (1<<40 - 1)) << 8
		p.lastID.CompareAndSwap(0, prefix|start)
	}
	return p.lastID.Add(1)
}
