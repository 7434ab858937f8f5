package node

// The log kept short (docs/design.md, durability rule 4): the applier
// reports its applied index, the node asks the engine to flush once
// SnapshotCount+CatchUpEntries entries, or SnapshotBytes+CatchUpBytes bytes
// of entries, were applied past the last truncation (and SnapshotCount
// entries, or SnapshotBytes, past the last flush), and truncates the raft
// log up to the durable index the flush reports, less the catch-up margin:
// CatchUpEntries entries, or fewer if they hold more than CatchUpBytes.
//
// Log retention for loggers (--logger-retention: Config.LogRetention, the
// keepers the member names with KeepLogFor as its member list changes, and
// how far each holds the log, LoggersHeld):
//
//  1. While this member leads, the log is never truncated past the lowest
//     Match (acknowledged index) raft's progress holds for a keeper (a
//     strata logger learner): a keeper that acknowledged nothing to this
//     leader yet (Match 0, after an election) holds truncation entirely.
//     Only the leader sends a learner entries or a snapshot, and only the
//     leader knows the learners' Match.
//  2. On a follower, the log is never truncated past the lowest committed
//     index a keeper was last known to hold (LoggersHeld: the member asks
//     each logger's Status); a keeper not heard of yet holds truncation
//     entirely. The committed index, not the last: a logger's uncommitted
//     tail may be replaced by a new leader, which must then still have the
//     entries from there on.
//
// So whichever member leads next, its log reaches back to what every
// logger holds, and a logger that is behind catches up from the log,
// never from a snapshot: it records no gap (docs/logger.md, "Log
// retention"). Log compaction into batch files (package logcompact, its
// invariant 6) keeps the same bound, as of the node's last tick
// (LogKeptFor).

import (
	"errors"
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
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
	if n.flushing || n.cfg.Engine == nil || !n.truncationDue() {
		return
	}
	n.flushing = true
	n.flushedAt = n.applied
	n.flushes.Add(1)
	go func() {
		defer n.flushes.Done()
		// Flushing may take a while; it runs off the node goroutine and
		// reports the durable index it reached.
		res := flushResult{}
		if err := n.cfg.Engine.Flush(); err != nil {
			res.err = fmt.Errorf("engine flush: %w", err)
		} else {
			res.durable = n.cfg.Engine.DurableIndex()
		}
		select {
		case n.flushc <- res:
		case <-n.done:
		}
	}()
}

// flushDone takes the result of a background flush: the log is compacted
// up to what the flush made durable, or its error stops the node.
func (n *Node) flushDone(d flushResult) error {
	n.flushing = false
	if d.err != nil {
		return d.err
	}
	return n.compactLog(d.durable)
}

// flushResult is what a background engine flush reports to the node: the
// durable index it reached, or its error, which stops the node. An engine
// that cannot make applied state durable cannot let the log be truncated,
// and the log would grow without bound while the member went on as if
// nothing were wrong; etcd stops when its backend cannot commit. The log
// holds every entry the engine lost, for a restart to replay.
type flushResult struct {
	durable uint64
	err     error
}

// DefaultSnapshotBytes and DefaultCatchUpBytes are Config.SnapshotBytes
// and Config.CatchUpBytes when left 0: with them the log holds at most
// about 16 MiB of entries past the durable index's margin plus what a
// flush takes to finish, and a restart after a crash replays at most about
// 8 MiB. They were 32 MiB each; at 8 MiB a restart right after a 10^6-key
// load took 0.46-0.56 s instead of 0.71-0.87 s, with the same load rate,
// and the disk after the load was 106 MiB instead of 135
// (docs/bench/performance.md, "Start-up replay in pieces"). Entries of
// under 840 bytes reach --snapshot-count's 10,000 first, so only logs of
// large entries (transactions of many puts, large values) see them.
const (
	DefaultSnapshotBytes = 8 << 20
	DefaultCatchUpBytes  = 8 << 20
)

// truncationDue reports whether enough was applied past the last
// truncation and the last flush, in entries or in bytes, to flush again.
func (n *Node) truncationDue() bool {
	c := &n.cfg
	if n.applied-n.compactedTo >= c.SnapshotCount+c.CatchUpEntries && n.applied-n.flushedAt >= c.SnapshotCount {
		return true
	}
	return n.logSize.between(n.compactedTo, n.applied) >= c.SnapshotBytes+c.CatchUpBytes &&
		n.logSize.between(n.flushedAt, n.applied) >= c.SnapshotBytes
}

// compactLog drops log entries that the engine holds durably, keeping a
// margin below the durable index for followers: CatchUpEntries entries, or
// fewer if they hold more than CatchUpBytes.
func (n *Node) compactLog(durable uint64) error {
	var to uint64
	if durable > n.cfg.CatchUpEntries {
		to = durable - n.cfg.CatchUpEntries
	}
	if byBytes, ok := n.logSize.keepBelow(durable, n.cfg.CatchUpBytes); ok && byBytes > to {
		to = byBytes
	}
	if to == 0 {
		return nil
	}
	// The engine may be ahead of the log's last index after a snapshot
	// install (a full snapshot carries the leader's engine past the
	// snapshot's index): never compact past what the log holds.
	to = min(to, n.lastIdx.Load())
	if keep, held := n.keptFor(); held {
		n.logger.Debug("log truncation held for the loggers", zap.Uint64("acknowledged", keep))
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
		n.logSize.forget(to)
		return nil
	} else if err != nil {
		return fmt.Errorf("compact raft log to %d: %w", to, err)
	}
	n.compactedTo = to
	n.logSize.forget(to)
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

// LoggersHeld reports, per keeper, the committed index it was last known
// to hold (its own Status): a follower keeps its log back to the lowest
// (retention rule 2). Safe from any goroutine.
func (n *Node) LoggersHeld(held map[uint64]uint64) {
	m := make(map[uint64]uint64, len(held))
	for id, idx := range held {
		m[id] = idx
	}
	n.held.Store(&m)
}

// keptFor returns the lowest index the keepers hold, and whether a keeper
// holds truncation back: Match on the leader (retention rule 1), what the
// keepers said on a follower (rule 2).
//
// REQUIRES: the node goroutine (it reads the RawNode).
func (n *Node) keptFor() (uint64, bool) {
	if !n.cfg.LogRetention {
		return 0, false
	}
	p := n.keepers.Load()
	if p == nil || len(*p) == 0 {
		return 0, false
	}
	keepers := *p
	leader := n.rn.BasicStatus().RaftState == raft.StateLeader
	var progress map[uint64]tracker.Progress
	var heldBy map[uint64]uint64
	if leader {
		progress = n.rn.Status().Progress
	} else if hp := n.held.Load(); hp != nil {
		heldBy = *hp
	}
	low, held := uint64(0), false
	for _, id := range keepers {
		var idx uint64
		if leader {
			pr, ok := progress[id]
			if !ok {
				continue // not in the configuration (yet, or any more)
			}
			idx = pr.Match
		} else {
			idx = heldBy[id] // 0 if never heard of: hold everything
		}
		if !held || idx < low {
			low, held = idx, true
		}
	}
	return low, held
}

// keptIndex is keptFor's answer, published for other goroutines.
type keptIndex struct {
	index uint64
	held  bool
}

// publishKept publishes keptFor's answer for LogKeptFor, at every tick.
//
// REQUIRES: the node goroutine.
func (n *Node) publishKept() {
	if !n.cfg.LogRetention {
		return
	}
	index, held := n.keptFor()
	n.kept.Store(&keptIndex{index: index, held: held})
}

// LogKeptFor reports, under Config.LogRetention, the lowest index the
// cluster's strata loggers hold and whether they hold the log back at all
// (retention rules 1 and 2, as of the node's last tick): what else rewrites
// the log behind the node (log compaction into batch files) must keep the
// entries after index as entries. Before the first tick it holds
// everything (0, true); without LogRetention nothing (0, false). Safe from
// any goroutine.
func (n *Node) LogKeptFor() (index uint64, held bool) {
	if !n.cfg.LogRetention {
		return 0, false
	}
	k := n.kept.Load()
	if k == nil {
		return 0, true
	}
	return k.index, k.held
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
