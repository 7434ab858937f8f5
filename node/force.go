package node

// Forcing a new cluster (etcd's --force-new-cluster): before raft starts, the
// log of a member restarted on its data directory is rewritten so that the
// member is the only voter of its cluster, keeping its member ID, its cluster
// ID and every entry its log holds.

import (
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/confchange"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
)

// ErrForceNewCluster wraps the reasons a member cannot be forced to a new
// one-member cluster; nothing has been written when it is returned.
var ErrForceNewCluster = errors.New("node: cannot force a new cluster")

// forceReadBytes bounds one read of the log while forceNewCluster looks
// for membership entries: the log may hold far more than fits in memory.
const forceReadBytes = 64 << 20

// forceNewCluster rewrites the log under --force-new-cluster, before raft
// is created, as etcd's bootstrapWALFromSnapshot does, with one
// difference (step 1):
//
//  1. Every entry in the log is taken as committed. etcd instead keeps
//     only up to max(the WAL's commit index, the applied index) and
//     discards the rest ("discarding uncommitted WAL entries"); but a
//     commit-only HardState is written lazily, in etcd as here
//     (persistCommit), and the applied index is durable only at an engine
//     flush, so a write acknowledged just before a crash can lie past both
//     and etcd loses it (e2e.TestForceNewClusterSingleMember shows etcd
//     3.7.3 doing so). Committing the whole log is what raft itself does
//     when this member wins an election: its first entry as leader commits
//     every entry before it. An entry no quorum held may then take effect;
//     its client got an error or no answer, which in etcd's contract leaves
//     the outcome unknown, as for any request in flight during a failure.
//  2. The membership raft will hold at the log's last index is computed the
//     way raft computes it: from the conf state it starts from (the state
//     machine's at Applied, or the log's at raftApplied) through the
//     membership entries after it, with raft's own confchange package, so
//     that an entry raft would refuse is refused here, before anything is
//     written.
//  3. One EntryConfChange removing each other member, voter or learner, is
//     appended after the last entry, in the HardState's term, with a
//     HardState whose commit index is the last of them, in one synced
//     Append: durable before raft starts, so before anything is served, and
//     committed in the log itself, so still committed at a restart without
//     the flag (etcd commits them in memory only). With nobody else left,
//     only the HardState is written.
//
// raft then delivers the entries as committed: the node applies them to
// raft (step 4 of the Ready loop) and the applier to the member list, like
// any membership change, so that both say one member.
//
// The member must be a voter at the last index (etcd would add a member it
// cannot find back, with a placeholder peer URL, and crash on a learner);
// a snapshot install the log has not caught up with (pendingUntil) leaves
// the state machine past the log, with no term for its index; all three are
// refused, before anything is written. It returns the log's new last index.
func forceNewCluster(cfg Config, raftApplied, pendingUntil uint64) (uint64, error) {
	if pendingUntil != 0 {
		return 0, fmt.Errorf("%w: the state machine is at index %d, past the raft log's last entry, after a snapshot install the log had not caught up with; start without --force-new-cluster while the leader that sent it is reachable, or restore a backup",
			ErrForceNewCluster, pendingUntil)
	}
	hs, logCS, err := cfg.Log.InitialState()
	if err != nil {
		return 0, fmt.Errorf("read the log's HardState: %w", err)
	}
	last, err := cfg.Log.LastIndex()
	if err != nil {
		return 0, fmt.Errorf("read last log index: %w", err)
	}
	// Step 1. New has checked that the state machine is within the log.
	logCommit := hs.GetCommit()
	if known := max(logCommit, cfg.Applied); last > known {
		cfg.ServerLogger.Info("committing the entries past the WAL commit index, as the only member",
			zap.Uint64("commit-index-from-wal", logCommit), zap.Uint64("applied-index", cfg.Applied),
			zap.Uint64("last-index", last), zap.Uint64("number-of-entries", last-known))
	}
	// Step 2.
	startCS, from := logCS, raftApplied
	if cfg.ConfState != nil {
		startCS, from = cfg.ConfState, cfg.Applied
	}
	cs, err := confStateAt(cfg.Log, startCS, from, last)
	if err != nil {
		return 0, err
	}
	if len(cs.GetVotersOutgoing()) > 0 {
		return 0, fmt.Errorf("%w: the membership at index %d is a joint configuration (%s)", ErrForceNewCluster, last, raft.DescribeConfState(cs))
	}
	if !slices.Contains(cs.GetVoters(), cfg.ID) {
		if slices.Contains(cs.GetLearners(), cfg.ID) {
			return 0, fmt.Errorf("%w: member %x is a learner at index %d (%s); only a voting member can become the cluster's only member",
				ErrForceNewCluster, cfg.ID, last, raft.DescribeConfState(cs))
		}
		return 0, fmt.Errorf("%w: member %x is not in its cluster's membership at index %d (%s): was it removed?",
			ErrForceNewCluster, cfg.ID, last, raft.DescribeConfState(cs))
	}
	// Step 3. The term is the HardState's: no entry has a later one (raft
	// records a term before it accepts entries of it), and raft restarts
	// in it.
	term := hs.GetTerm()
	if t, err := cfg.Log.Term(last); err != nil {
		return 0, fmt.Errorf("read the term of entry %d: %w", last, err)
	} else if t > term {
		return 0, fmt.Errorf("%w: entry %d has term %d, past the HardState's term %d", ErrForceNewCluster, last, t, term)
	}
	var ents []*raftpb.Entry
	next := last + 1
	others := append(slices.Clone(cs.GetVoters()), cs.GetLearners()...)
	slices.Sort(others)
	for _, id := range others {
		if id == cfg.ID {
			continue
		}
		data, err := proto.Marshal(&raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(id)})
		if err != nil {
			return 0, fmt.Errorf("encode the removal of member %x: %w", id, err)
		}
		ents = append(ents, &raftpb.Entry{
			Type: raftpb.EntryConfChange.Enum(), Term: proto.Uint64(term), Index: proto.Uint64(next), Data: data,
		})
		next++
	}
	newHS := &raftpb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(hs.GetVote()), Commit: proto.Uint64(next - 1)}
	if err := cfg.Log.Append(ents, newHS); err != nil {
		return 0, fmt.Errorf("append the forced membership entries: %w", err)
	}
	cfg.ServerLogger.Info("forcing restart member",
		zap.String("cluster-id", fmt.Sprintf("%x", cfg.ClusterID)),
		zap.String("local-member-id", fmt.Sprintf("%x", cfg.ID)),
		zap.Uint64("wal-commit-index", logCommit),
		zap.Uint64("commit-index", next-1),
		zap.Int("removed-members", len(ents)))
	return next - 1, nil
}

// confStateAt is the membership raft reaches at index upTo when it starts
// from cs at index from and applies the membership entries in (from, upTo]:
// raft's own confchange rules (RawNode.ApplyConfChange).
func confStateAt(log Log, cs *raftpb.ConfState, from, upTo uint64) (*raftpb.ConfState, error) {
	chg := confchange.Changer{Tracker: tracker.MakeProgressTracker(1, 0), LastIndex: upTo}
	cfg, prs, err := confchange.Restore(chg, cs)
	if err != nil {
		return nil, fmt.Errorf("%w: restore conf state %s at index %d: %v", ErrForceNewCluster, raft.DescribeConfState(cs), from, err)
	}
	chg.Tracker.Config, chg.Tracker.Progress = cfg, prs
	for lo := from + 1; lo <= upTo; {
		ents, err := log.Entries(lo, upTo+1, forceReadBytes)
		if err != nil {
			return nil, fmt.Errorf("read log entries %d..%d: %w", lo, upTo, err)
		}
		if len(ents) == 0 {
			return nil, fmt.Errorf("read log entries %d..%d: none returned", lo, upTo)
		}
		for _, e := range ents {
			var cc *raftpb.ConfChangeV2
			switch e.GetType() {
			case raftpb.EntryConfChange:
				var v1 raftpb.ConfChange
				if err := proto.Unmarshal(e.GetData(), &v1); err != nil {
					return nil, fmt.Errorf("decode conf change at index %d: %w", e.GetIndex(), err)
				}
				cc = v1.AsV2()
			case raftpb.EntryConfChangeV2:
				cc = &raftpb.ConfChangeV2{}
				if err := proto.Unmarshal(e.GetData(), cc); err != nil {
					return nil, fmt.Errorf("decode conf change at index %d: %w", e.GetIndex(), err)
				}
			default:
				continue
			}
			if cc.LeaveJoint() {
				cfg, prs, err = chg.LeaveJoint()
			} else if autoLeave, ok := cc.EnterJoint(); ok {
				cfg, prs, err = chg.EnterJoint(autoLeave, cc.GetChanges()...)
			} else {
				cfg, prs, err = chg.Simple(cc.GetChanges()...)
			}
			if err != nil {
				return nil, fmt.Errorf("%w: conf change at index %d: %v", ErrForceNewCluster, e.GetIndex(), err)
			}
			chg.Tracker.Config, chg.Tracker.Progress = cfg, prs
		}
		lo = ents[len(ents)-1].GetIndex() + 1
	}
	return chg.Tracker.ConfState(), nil
}
