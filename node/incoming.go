package node

// Writes on their way: a leader's group commit waits for the write requests
// it knows are coming.
//
// One Ready carries the proposals that reached the node since the last one,
// and its append costs one fsync. strata's loop is short (one fsync and
// little else), so under load fewer proposals share each sync than in etcd:
// 15 puts per fdatasync against etcd's 67 at 1,000 clients
// (docs/bench/performance.md, "Group commit under load"). A fixed wait
// before each append cuts the syncs but halves the rate at a few clients,
// whose next writes cannot come before this batch's answer.
//
// So the wait is driven by a count. The client API counts a write request
// from the moment it arrives (Incoming.Arrive) until the node takes its
// proposal (the arrival travels in the proposal's context) or the request
// ends without proposing (its context is done). The invariants, kept by
// this file:
//
//  1. Incoming's count is the number of arrivals not yet released, and an
//     arrival is released exactly once: the first of the node taking its
//     proposal, the request's context ending, and ReleaseArrival.
//  2. The node waits only as a leader, only after it has taken every queued
//     proposal, only while the count is above zero, and never longer than
//     Config.IncomingWait per Ready: a counted request that never proposes
//     (refused by the quota, its client gone) costs at most that bound.
//
// A lone writer is never held: when the node decides, its write is in the
// batch and the count is zero. With a few clients a hold starts only while
// another client's write is already on its way, and ends when it arrives.
// Under load the count is rarely zero and each append waits up to the
// bound, which lengthens the cycle as etcd's is long, without a guess
// (docs/bench/performance.md has how often each happens).

import (
	"context"
	"sync/atomic"
	"time"
)

// DefaultIncomingWait is Config.IncomingWait's default: the longest a
// leader holds an append for writes on their way. Measured in
// docs/bench/performance.md ("Group commit that waits for the writes on
// their way").
const DefaultIncomingWait = time.Millisecond

// Incoming counts the write requests a member's client API has received and
// not yet handed to its node. The zero value is ready; a nil *Incoming
// counts nothing. Safe for concurrent use.
type Incoming struct {
	pending atomic.Int64
}

// arrival is one counted request; see invariant 1.
type arrival struct {
	in       *Incoming
	released atomic.Bool
	// stopOnEnd unregisters the release at the request's end; set before
	// the arrival is published in a context, so the node may call it.
	stopOnEnd func() bool
}

// release releases the arrival if nothing has, and says whether it did.
func (a *arrival) release() bool {
	if a != nil && a.released.CompareAndSwap(false, true) {
		a.in.pending.Add(-1)
		return true
	}
	return false
}

// taken is the node's release, when it takes the proposal: the request's
// end then has nothing left to do.
func (a *arrival) taken() {
	if a.release() {
		a.stopOnEnd()
	}
}

type arrivalKey struct{}

// Arrive counts a write request and returns a context that carries its
// arrival: Propose hands it to the node, which releases it when it takes
// the proposal. ctx must be done once the request has ended (gRPC cancels
// a request's context when it finishes), which releases the arrival if the
// node has not: a request that never proposed.
func (in *Incoming) Arrive(ctx context.Context) context.Context {
	if in == nil {
		return ctx
	}
	in.pending.Add(1)
	a := &arrival{in: in}
	a.stopOnEnd = context.AfterFunc(ctx, func() { a.release() })
	return context.WithValue(ctx, arrivalKey{}, a)
}

// ReleaseArrival releases the arrival ctx carries, if any and not yet released.
func ReleaseArrival(ctx context.Context) { arrivalOf(ctx).release() }

// Pending is the number of counted requests not yet released.
func (in *Incoming) Pending() int64 {
	if in == nil {
		return 0
	}
	return in.pending.Load()
}

// arrivalOf returns the arrival ctx carries, or nil.
func arrivalOf(ctx context.Context) *arrival {
	a, _ := ctx.Value(arrivalKey{}).(*arrival)
	return a
}

// awaitIncoming holds the next Ready while writes are on their way
// (invariant 2): it takes proposals and peer messages until the count
// falls to zero, IncomingWait has passed or ctx ends.
func (n *Node) awaitIncoming(ctx context.Context) {
	in := n.cfg.Incoming
	if in.Pending() == 0 || n.leader.Load() != n.cfg.ID {
		return
	}
	if n.incomingTimer == nil {
		n.incomingTimer = time.NewTimer(n.incomingWait)
	} else {
		n.incomingTimer.Reset(n.incomingWait)
	}
	defer n.incomingTimer.Stop()
	n.incomingWaits.Add(1)
	for in.Pending() > 0 {
		select {
		case p := <-n.propc:
			n.handleProposal(p)
		case m := <-n.recvc:
			n.step(m)
		case <-n.incomingTimer.C:
			n.incomingTimeouts.Add(1)
			return
		case <-ctx.Done():
			return
		}
	}
}
