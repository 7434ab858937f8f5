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

// ReadIndex returns a commit index that a linearizable read must wait to
// see applied. Concurrent callers share one raft ReadIndex round.
func (n *Node) ReadIndex(ctx context.Context) (uint64, error) {
	c := make(chan readResult, 1)
	select {
	case n.readc <- c:
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
	for _, c := range n.readInFlight[seq] {
		c <- readResult{index: rs.Index}
	}
	delete(n.readInFlight, seq)
	delete(n.readIssuedAt, seq)
	n.issueReadIndex()
}

// retryStaleReads reissues a ReadIndex round that raft dropped (a leader
// change loses them silently) after an election timeout.
func (n *Node) retryStaleReads() {
	for seq, at := range n.readIssuedAt {
		if n.ticks-at < n.cfg.ElectionTicks {
			continue
		}
		n.readPending = append(n.readInFlight[seq], n.readPending...)
		delete(n.readInFlight, seq)
		delete(n.readIssuedAt, seq)
	}
	n.issueReadIndex()
}
