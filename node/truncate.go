package node

// The log kept short (docs/design.md, durability rule 4): the applier
// reports its applied index, the node asks the engine to flush once
// SnapshotCount+CatchUpEntries entries were applied past the last
// truncation, and truncates the raft log up to the durable index the flush
// reports, less the catch-up margin.

import (
	"errors"
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
)

// Applied reports that the state machine has applied (and committed to the
// engine) every entry up to index.
func (n *Node) Applied(index uint64) {
	select {
	case n.appliedc <- index:
	case <-n.done:
	default:
		// The channel holds reports the node has not read yet; replace
		// one with this higher report rather than block the applier.
		select {
		case <-n.appliedc:
		default:
		}
		select {
		case n.appliedc <- index:
		default:
		}
	}
}

func (n *Node) handleApplied(idx uint64) {
	if idx > n.applied {
		n.applied = idx
	}
	if n.flushing || n.cfg.Engine == nil || n.applied-n.compactedTo < n.cfg.SnapshotCount+n.cfg.CatchUpEntries {
		return
	}
	n.flushing = true
	n.flushes.Add(1)
	go func() {
		defer n.flushes.Done()
		// Flushing may take a while; it runs off the node goroutine and
		// reports the durable index it reached.
		if err := n.cfg.Engine.Flush(); err != nil {
			n.logger.Error("engine flush failed; log not compacted", zap.Error(err))
			select {
			case n.flushc <- 0:
			case <-n.done:
			}
			return
		}
		select {
		case n.flushc <- n.cfg.Engine.DurableIndex():
		case <-n.done:
		}
	}()
}

// compactLog drops log entries that the engine holds durably, keeping
// CatchUpEntries below the durable index for followers.
func (n *Node) compactLog(durable uint64) error {
	if durable <= n.cfg.CatchUpEntries {
		return nil
	}
	to := durable - n.cfg.CatchUpEntries
	// The engine may be ahead of the log's last index after a snapshot
	// install (a full snapshot carries the leader's engine past the
	// snapshot's index): never compact past what the log holds.
	to = min(to, n.lastIdx.Load())
	if to <= n.compactedTo {
		return nil
	}
	cs := n.confStateAt(to)
	if cs == nil {
		return nil
	}
	if err := n.cfg.Log.Compact(to, cs); errors.Is(err, raft.ErrCompacted) {
		// Log compaction into batch files already moved the log's
		// snapshot point past to (raftlog/compactlog.go).
		n.compactedTo = to
		return nil
	} else if err != nil {
		return fmt.Errorf("compact raft log to %d: %w", to, err)
	}
	n.compactedTo = to
	n.firstIdx.Store(to + 1)
	n.logger.Debug("compacted raft log", zap.Uint64("to", to), zap.Uint64("durable", durable))
	return nil
}

// confStateAt returns the membership in force at index, and forgets the
// history before it that no later compaction will need.
func (n *Node) confStateAt(index uint64) *raftpb.ConfState {
	var cs *raftpb.ConfState
	keep := 0
	for i, c := range n.confHistory {
		if c.index <= index {
			cs, keep = c.cs, i
		}
	}
	n.confHistory = n.confHistory[keep:]
	if cs == nil {
		return n.lastConfState
	}
	return cs
}
