package node

// Linearizable reads. ReadIndex requests arriving together share one raft
// read-index round; each is answered with the commit index raft confirms
// once this member is still the leader, and the caller then waits until the
// applier has reached it.

import (
	"context"
	"encoding/binary"

	"go.etcd.io/raft/v3"
)

type readResult struct {
	index uint64
	err   error
}

// readWaiter is one ReadIndex caller: its answer channel, and its context,
// so that a round retried after a stall leaves out the callers that have
// given up (with no leader, rounds stall for as long as the outage lasts).
type readWaiter struct {
	ctx context.Context
	c   chan readResult
}

// ReadIndex returns a commit index that a linearizable read must wait to
// see applied. Concurrent callers share one raft ReadIndex round.
func (n *Node) ReadIndex(ctx context.Context) (uint64, error) {
	c := make(chan readResult, 1)
	select {
	case n.readc <- readWaiter{ctx: ctx, c: c}:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.done:
		return 0, n.err()
	}
	select {
	case r := <-c:
		return r.index, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.done:
		return 0, n.err()
	}
}

// issueReadIndex starts a ReadIndex round for the pending readers unless
// one is already in flight; readers that arrive meanwhile wait for the next
// round, so a round costs one heartbeat however many reads it serves.
func (n *Node) issueReadIndex() {
	if len(n.readInFlight) > 0 || len(n.readPending) == 0 {
		return
	}
	n.readSeq++
	var rctx [8]byte
	binary.BigEndian.PutUint64(rctx[:], n.readSeq)
	n.readInFlight[n.readSeq] = n.readPending
	n.readIssuedAt[n.readSeq] = n.ticks
	n.readPending = nil
	n.rn.ReadIndex(rctx[:])
}

func (n *Node) answerReads(rs raft.ReadState) {
	if len(rs.RequestCtx) != 8 {
		return
	}
	seq := binary.BigEndian.Uint64(rs.RequestCtx)
	for _, w := range n.readInFlight[seq] {
		w.c <- readResult{index: rs.Index}
	}
	delete(n.readInFlight, seq)
	delete(n.readIssuedAt, seq)
	n.issueReadIndex()
}

// retryStaleReads reissues a ReadIndex round that raft dropped (a leader
// change loses them silently) after an election timeout, for the callers
// still waiting.
func (n *Node) retryStaleReads() {
	for seq, at := range n.readIssuedAt {
		if n.ticks-at < n.cfg.ElectionTicks {
			continue
		}
		waiting := n.readInFlight[seq][:0]
		for _, w := range n.readInFlight[seq] {
			if w.ctx.Err() == nil {
				waiting = append(waiting, w)
			}
		}
		n.readPending = append(waiting, n.readPending...)
		delete(n.readInFlight, seq)
		delete(n.readIssuedAt, seq)
	}
	n.issueReadIndex()
}
