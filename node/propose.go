package node

// Proposals, and the other requests that goroutines other than the node
// goroutine hand to it (membership changes, leadership transfer, status,
// messages from peers): each is queued and performed by the Ready loop,
// the only goroutine that touches the RawNode.

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
)

type proposal struct {
	data []byte
	cc   raftpb.ConfChangeI
	errc chan error
	// arrival is the counted write request this proposal is for, nil if
	// none (incoming.go); the node releases it when it takes the proposal.
	arrival *arrival
}

// Propose replicates data. It returns once raft accepted the proposal into
// its log (not once it committed: callers wait for the applier's answer).
func (n *Node) Propose(ctx context.Context, data []byte) error {
	return n.propose(ctx, proposal{data: data, errc: make(chan error, 1), arrival: arrivalOf(ctx)})
}

// ProposeConfChange replicates a membership change. raft refuses a change
// while another is pending by turning it into an empty entry, so callers
// wait for the applier's answer with a deadline.
func (n *Node) ProposeConfChange(ctx context.Context, cc raftpb.ConfChangeI) error {
	return n.propose(ctx, proposal{cc: cc, errc: make(chan error, 1)})
}

func (n *Node) propose(ctx context.Context, p proposal) error {
	select {
	case n.propc <- p:
	case <-ctx.Done():
		return ctx.Err()
	case <-n.done:
		return n.err()
	}
	select {
	case err := <-p.errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-n.done:
		return n.err()
	}
}

func (n *Node) handleProposal(p proposal) {
	if p.arrival != nil {
		p.arrival.taken()
	}
	var err error
	if p.cc != nil {
		err = n.rn.ProposeConfChange(p.cc)
	} else {
		err = n.rn.Propose(p.data)
	}
	if errors.Is(err, raft.ErrProposalDropped) && n.leader.Load() == 0 {
		err = ErrNoLeader
	}
	p.errc <- err
}

// step feeds a message from a peer to raft.
func (n *Node) step(m *raftpb.Message) {
	if err := n.rn.Step(m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
		n.logger.Debug("step message", zap.Stringer("type", m.GetType()), zap.Uint64("from", m.GetFrom()), zap.Error(err))
	}
}

// Process hands a message received from a peer to the node goroutine. It
// implements the transport's Handler.
func (n *Node) Process(ctx context.Context, m *raftpb.Message) error {
	select {
	case n.recvc <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.done:
		return n.err()
	}
}

// control runs f on the node goroutine, without waiting for it.
func (n *Node) control(f func(*raft.RawNode)) {
	select {
	case n.ctrlc <- f:
	case <-n.done:
	}
}

// ReportUnreachable tells raft a peer could not be reached, so that it
// stops pipelining to it.
func (n *Node) ReportUnreachable(id uint64) {
	n.control(func(rn *raft.RawNode) { rn.ReportUnreachable(id) })
}

// ReportSnapshot tells raft how sending a snapshot to a peer ended.
func (n *Node) ReportSnapshot(id uint64, status raft.SnapshotStatus) {
	n.control(func(rn *raft.RawNode) { rn.ReportSnapshot(id, status) })
}

// TransferLeadership asks the leader to hand leadership to transferee and
// waits until a leader other than this member is known, or ctx ends.
func (n *Node) TransferLeadership(ctx context.Context, transferee uint64) error {
	n.control(func(rn *raft.RawNode) { rn.TransferLeader(transferee) })
	for n.leader.Load() != transferee {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-n.done:
			return n.err()
		case <-time.After(n.cfg.TickInterval):
		}
	}
	return nil
}

// Status returns raft's status, with each follower's progress when this
// member leads. It waits for the node goroutine.
func (n *Node) Status(ctx context.Context) (raft.Status, error) {
	c := make(chan raft.Status, 1)
	n.control(func(rn *raft.RawNode) { c <- rn.Status() })
	select {
	case st := <-c:
		return st, nil
	case <-ctx.Done():
		return raft.Status{}, ctx.Err()
	case <-n.done:
		return raft.Status{}, n.err()
	}
}
