package node

// The log kept short (docs/design.md, durability rule 4): the applier
// reports its applied index, the node asks the engine to flush once
// SnapshotCount+CatchUpEntries entries were applied past the last
// truncation (and SnapshotCount past the last flush), and truncates the raft
// log up to the durable index the flush reports, less the catch-up margin.
//
// Log retention for loggers (--logger-retention: Config.LogRetention, and
// the keepers the member names with KeepLogFor as its member list changes):
//
//  1. While this member leads, the log is never truncated past the lowest
//     Match (acknowledged index) raft's progress holds for a keeper (a
//     strata logger learner): a keeper that acknowledged nothing to this
//     leader yet (Match 0, after an election) holds truncation entirely.
//     Only the leader sends a learner entries or a snapshot, and only the
//     leader knows the learners' Match; so a logger that stays behind one
//     leader catches up from that leader's log, never from a snapshot, and
//     records no gap.
//  2. A follower truncates as without keepers: it knows no learner's
//     Match. If it becomes leader while a logger is further behind than
//     its log reaches, that logger gets a snapshot and records a gap
//     (docs/logger.md, "Log retention").

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
	if n.flushing || n.cfg.Engine == nil || n.applied-n.compactedTo < n.cfg.SnapshotCount+n.cfg.CatchUpEntries ||
		n.applied-n.flushedAt < n.cfg.SnapshotCount {
		return
	}
	n.flushing = true
	n.flushedAt = n.applied
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
	if keep, held := n.keptFor(); held {
		to = min(to, keep)
	}
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

// KeepLogFor names the members the log is kept for under
// Config.LogRetention (the cluster's strata loggers), replacing the
// previous list; the member calls it with each new member list. Safe from
// any goroutine.
func (n *Node) KeepLogFor(ids []uint64) {
	ids = append([]uint64(nil), ids...)
	n.keepers.Store(&ids)
}

// keptFor returns the lowest index a keeper acknowledged, and whether a
// keeper holds truncation back (retention rule 1): only on the leader.
//
// REQUIRES: the node goroutine (it reads the RawNode).
func (n *Node) keptFor() (uint64, bool) {
	if !n.cfg.LogRetention || n.rn.BasicStatus().RaftState != raft.StateLeader {
		return 0, false
	}
	p := n.keepers.Load()
	if p == nil || len(*p) == 0 {
		return 0, false
	}
	keepers := *p
	progress := n.rn.Status().Progress
	low, held := uint64(0), false
	for _, id := range keepers {
		pr, ok := progress[id]
		if !ok {
			continue // not in the configuration (yet, or any more)
		}
		if !held || pr.Match < low {
			low, held = pr.Match, true
		}
	}
	if held {
		n.logger.Debug("log truncation held for the loggers", zap.Uint64("acknowledged", low))
	}
	return low, held
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
