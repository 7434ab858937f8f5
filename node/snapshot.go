package node

// Snapshots: installing one the leader sent (the engine first, then the
// log restarted after it, with a pending-snapshot record in the log in
// between so that a crash at any point is reconciled at start-up), and the
// storage raft restarts from.

import (
	"context"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
)

// reconcileSnapshot finishes, at start-up, a snapshot install that a crash
// or a stop interrupted, and accepts an engine that an install left past
// the log's end. An install has two steps in two stores (installSnapshot):
// the state machine takes the snapshot, then the log restarts after it;
// and the state machine may then be past the log's last index (a full
// snapshot carries the leader's engine at its applied index X >= the
// snapshot's index S; an incremental one may end above S) until the log
// has received the entries up to X. Before the first step the node records
// the snapshot's metadata in the log (BeginSnapshot); it removes the
// record once the log's last index has reached the engine's applied index
// (pendingUntil). With a record left at start-up:
//
//  1. if the state machine is at or past the snapshot's index, it took the
//     snapshot: the log is restarted after it, unless it already was;
//     otherwise the install did not reach the state machine, and the log
//     is left as it is;
//  2. if the state machine is now at or below the log's last index, the
//     record has served and is removed;
//  3. otherwise the state machine is past the log's end because of an
//     install: raft is told that the log's snapshot point was applied,
//     with the log's ConfState there. It redelivers the log's entries and
//     learns the rest from the leader; the node applies their membership
//     changes to raft, and the applier skips what its engine holds, as
//     after an install at run time. (This member cannot become leader
//     meanwhile: its log lacks committed entries.) The record stays until
//     the log reaches the engine's index, which is returned.
//
// Without a record, an engine past the log's last index means the log lost
// synced entries, and New refuses to start.
func reconcileSnapshot(cfg *Config) (pendingUntil uint64, err error) {
	p := cfg.Log.PendingSnapshot()
	if p == nil {
		return 0, nil
	}
	first, err := cfg.Log.FirstIndex()
	if err != nil {
		return 0, fmt.Errorf("read first log index: %w", err)
	}
	if cfg.Applied >= p.GetIndex() && first-1 < p.GetIndex() {
		cfg.Logger.Info("restarting the raft log after a snapshot the state machine installed before a crash or stop",
			zap.Uint64("snapshot-index", p.GetIndex()), zap.Uint64("snapshot-term", p.GetTerm()),
			zap.Uint64("applied-index", cfg.Applied))
		if err := cfg.Log.ApplySnapshot(p); err != nil {
			return 0, fmt.Errorf("restart raft log after pending snapshot %d: %w", p.GetIndex(), err)
		}
	}
	last, err := cfg.Log.LastIndex()
	if err != nil {
		return 0, fmt.Errorf("read last log index: %w", err)
	}
	if cfg.Applied <= last {
		if err := cfg.Log.ForgetPendingSnapshot(); err != nil {
			return 0, fmt.Errorf("drop pending snapshot %d: %w", p.GetIndex(), err)
		}
		return 0, nil
	}
	if first, err = cfg.Log.FirstIndex(); err != nil {
		return 0, fmt.Errorf("read first log index: %w", err)
	}
	_, cs, err := cfg.Log.InitialState()
	if err != nil {
		return 0, fmt.Errorf("read the log's conf state: %w", err)
	}
	cfg.Logger.Info("the state machine is past the raft log's end after a snapshot install; raft restarts from the log's snapshot point",
		zap.Uint64("applied-index", cfg.Applied), zap.Uint64("log-snapshot-index", first-1), zap.Uint64("log-last-index", last))
	pendingUntil = cfg.Applied
	cfg.Applied, cfg.ConfState = first-1, cs
	return pendingUntil, nil
}

// forgetPendingSnapshot removes the record of the last snapshot install
// once the log holds every entry up to the state machine's applied index
// after it (pendingUntil).
func (n *Node) forgetPendingSnapshot() error {
	if n.pendingUntil == 0 || n.lastIdx.Load() < n.pendingUntil {
		return nil
	}
	if err := n.cfg.Log.ForgetPendingSnapshot(); err != nil {
		return fmt.Errorf("drop the record of snapshot install: %w", err)
	}
	n.pendingUntil = 0
	return nil
}

// raftAppliedIndex is the index raft is told was applied, so that it
// redelivers the committed entries after it. That is the state machine's
// applied index, whose conf state (Config.ConfState) tells raft the
// membership there, except when the state machine holds no conf state
// although it applied entries beyond the log's snapshot point logSnap:
// every cluster's log begins with membership entries, so its engine lost
// the conf state written with them, and raft, told those entries were
// applied, would neither redeliver them nor find the membership anywhere
// else (the log's snapshot point predates them). raft would then run with
// an empty configuration for good: unable to campaign, and deaf to its
// peers' responses (RawNode.Step drops a response from a member outside
// its configuration), ReadIndex answers included. raft is instead told
// that only the log's snapshot point was applied, with the log's conf
// state there, and redelivers the entries after it; the node applies the
// membership entries among them to raft as it does for any committed
// entry, and the applier, which skips what the engine already holds,
// writes their conf state back.
func raftAppliedIndex(cfg Config, logSnap uint64) uint64 {
	if cfg.ConfState != nil || cfg.Applied <= logSnap {
		return cfg.Applied
	}
	cfg.Logger.Warn("the state machine holds no raft conf state at its applied index; raft replays the log from its snapshot point to learn the membership",
		zap.Uint64("applied-index", cfg.Applied), zap.Uint64("log-snapshot-index", logSnap))
	return logSnap
}

// restartStorage adjusts what raft reads at start-up. The HardState's commit
// index is persisted lazily (a commit-only change is not synced, as in
// etcd), so after a crash it may trail what the engine applied; entries the
// engine applied were committed, so commit is raised to the applied index.
// The conf state is the state machine's, which matches Config.Applied.
//
// It also answers Snapshot with the state machine's current applied index
// rather than the log's compaction point: a follower is sent the engine as
// it is now, so the snapshot's membership must be today's (a member added
// after the compaction point must find itself in it, or raft refuses the
// snapshot). raft calls Snapshot on the node goroutine, which owns node.
type restartStorage struct {
	Log
	applied   uint64
	confState *raftpb.ConfState
	node      *Node
}

func (s *restartStorage) Snapshot() (*raftpb.Snapshot, error) {
	n := s.node
	if n == nil || n.applied <= n.compactedTo {
		return s.Log.Snapshot()
	}
	term, err := s.Log.Term(n.applied)
	if err != nil {
		return s.Log.Snapshot()
	}
	var cs *raftpb.ConfState
	for _, c := range n.confHistory {
		if c.index <= n.applied {
			cs = c.cs
		}
	}
	if cs == nil {
		cs = n.lastConfState
	}
	return &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
		Index: proto.Uint64(n.applied), Term: proto.Uint64(term), ConfState: cs,
	}}, nil
}

func (s *restartStorage) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	hs, cs, err := s.Log.InitialState()
	if err != nil {
		return nil, nil, err
	}
	if hs.GetCommit() < s.applied {
		hs = proto.CloneOf(hs)
		hs.Commit = proto.Uint64(s.applied)
	}
	if s.confState != nil {
		cs = s.confState
	}
	return hs, cs, nil
}

// installSnapshot has the applier make the state machine hold a snapshot
// from the leader (after every entry handed over before it), then restarts
// the log after it. The order is the durability
// argument: once the log forgets the entries before the snapshot, the
// engine must already hold their effect.
func (n *Node) installSnapshot(ctx context.Context, snap *raftpb.Snapshot) error {
	meta := snap.GetMetadata()
	// Recorded before the state machine takes it, so that start-up can
	// finish an install a crash interrupts (reconcileSnapshot).
	if err := n.cfg.Log.BeginSnapshot(meta); err != nil {
		return fmt.Errorf("record snapshot %d before installing it: %w", meta.GetIndex(), err)
	}
	done := make(chan error, 1)
	if err := n.handOff(ctx, Committed{Snapshot: snap, Installed: done}); err != nil {
		return err
	}
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("install snapshot at index %d: %w", meta.GetIndex(), err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := n.cfg.Log.ApplySnapshot(meta); err != nil {
		return fmt.Errorf("restart raft log after snapshot %d: %w", meta.GetIndex(), err)
	}
	n.applied = max(n.applied, meta.GetIndex())
	n.compactedTo = meta.GetIndex()
	n.logSize.reset()
	n.firstIdx.Store(meta.GetIndex() + 1)
	n.lastIdx.Store(meta.GetIndex())
	n.confHistory = []confAt{{index: meta.GetIndex(), cs: meta.GetConfState()}}
	n.lastConfState = meta.GetConfState()
	// The install ended with the engine durable at its new applied index,
	// which may be past the snapshot's: the record stays until the log
	// reaches it (pendingUntil).
	n.pendingUntil = meta.GetIndex()
	if n.cfg.Engine != nil {
		n.pendingUntil = max(n.pendingUntil, n.cfg.Engine.DurableIndex())
	}
	n.logger.Info("installed snapshot", zap.Uint64("index", meta.GetIndex()), zap.Uint64("term", meta.GetTerm()))
	return n.forgetPendingSnapshot()
}
