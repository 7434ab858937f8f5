package node

// Forcing a new cluster (etcd's --force-new-cluster): before raft starts, the
// log of a member restarted on its data directory is rewritten so that the
// member is the only voter of its cluster, keeping its member ID, its cluster
// ID and every committed entry.

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

// forceNewCluster rewrites the log as etcd's bootstrapWALFromSnapshot does
// under --force-new-cluster, before raft is created:
//
//  1. The commit index is the larger of the one the log records and the
//     state machine's applied index (cfg.Applied): a commit-only HardState
//     is written lazily (persistCommit), so after a crash the log's may
//     trail what was applied, and an applied entry was committed (etcd
//     takes max(HardState.Commit, consistent index) for the same reason).
//  2. Entries past it are discarded ("discarding uncommitted WAL entries"):
//     this member alone cannot tell whether a quorum held them, and etcd
//     drops them too. The entries appended next overwrite them.
//  3. The membership raft will hold at the commit index is computed the
//     way raft computes it: the conf state it starts from (the state
//     machine's at raftApplied, or the log's at its snapshot point) and the
//     membership entries after it, through raft's own confchange package.
//  4. One EntryConfChange removing each other member, voter or learner, is
//     appended at the commit index + 1 onwards, in the current term, with a
//     HardState whose commit index is the last of them, in one synced
//     Append: durable before raft starts, so before anything is served,
//     and still there at a restart without the flag (etcd commits them in
//     memory only, and they are recommitted at once by the member that is
//     now alone; strata records the commit so the log says so itself). If
//     no other member is left but entries were discarded, an empty entry
//     (a leader's no-op) takes the discarded tail's place.
//
// raft then delivers the new entries as committed: the node applies them
// to raft (step 4 of the Ready loop) and the applier to the member list,
// like any membership change, so that both say one member.
//
// The member must be a voter at the commit index (etcd would add a member
// it cannot find back with a placeholder peer URL, and crash on a learner);
// a snapshot install the log has not caught up with (pendingUntil) leaves
// no term for the state machine's index, so both are refused. It returns
// the log's new last index.
func forceNewCluster(cfg Config, raftApplied, pendingUntil uint64) (uint64, error) {
	if pendingUntil != 0 {
		return 0, fmt.Errorf("%w: the state machine is at index %d, past the raft log's last entry, after a snapshot install the log had not caught up with; start without --force-new-cluster while the leader that sent it is reachable, or restore a backup",
			ErrForceNewCluster, pendingUntil)
	}
	hs, logCS, err := cfg.Log.InitialState()
	if err != nil {
		return 0, fmt.Errorf("read the log's HardState: %w", err)
	}
	first, err := cfg.Log.FirstIndex()
	if err != nil {
		return 0, fmt.Errorf("read first log index: %w", err)
	}
	last, err := cfg.Log.LastIndex()
	if err != nil {
		return 0, fmt.Errorf("read last log index: %w", err)
	}
	logCommit := hs.GetCommit()
	commit := max(logCommit, cfg.Applied, first-1)
	if commit > last {
		return 0, fmt.Errorf("%w: commit index %d is past the raft log's last index %d", ErrForceNewCluster, commit, last)
	}
	// Step 3: the membership at commit, from where raft starts.
	startCS, from := logCS, raftApplied
	if cfg.ConfState != nil {
		startCS, from = cfg.ConfState, cfg.Applied
	}
	cs, err := confStateAt(cfg.Log, startCS, from, commit, last)
	if err != nil {
		return 0, err
	}
	if len(cs.GetVotersOutgoing()) > 0 {
		return 0, fmt.Errorf("%w: the membership at index %d is a joint configuration (%s)", ErrForceNewCluster, commit, raft.DescribeConfState(cs))
	}
	if !slices.Contains(cs.GetVoters(), cfg.ID) {
		if slices.Contains(cs.GetLearners(), cfg.ID) {
			return 0, fmt.Errorf("%w: member %x is a learner at index %d (%s); only a voting member can become the cluster's only member",
				ErrForceNewCluster, cfg.ID, commit, raft.DescribeConfState(cs))
		}
		return 0, fmt.Errorf("%w: member %x is not in its cluster's membership at index %d (%s): was it removed?",
			ErrForceNewCluster, cfg.ID, commit, raft.DescribeConfState(cs))
	}
	// Step 2.
	if last > commit {
		cfg.Logger.Info("discarding uncommitted WAL entries",
			zap.Uint64("entry-index", commit+1),
			zap.Uint64("commit-index-from-wal", logCommit),
			zap.Uint64("number-of-discarded-entries", last-commit))
	}
	// Step 4. The term is the HardState's: no entry in the log has a later
	// one, and raft starts in it.
	term := hs.GetTerm()
	if t, err := cfg.Log.Term(commit); err != nil {
		return 0, fmt.Errorf("read the term of entry %d: %w", commit, err)
	} else if t > term {
		return 0, fmt.Errorf("%w: entry %d has term %d, past the HardState's term %d", ErrForceNewCluster, commit, t, term)
	}
	var ents []*raftpb.Entry
	next := commit + 1
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
	if len(ents) == 0 && last > commit {
		ents = append(ents, &raftpb.Entry{Type: raftpb.EntryNormal.Enum(), Term: proto.Uint64(term), Index: proto.Uint64(next)})
		next++
	}
	newHS := &raftpb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(hs.GetVote()), Commit: proto.Uint64(next - 1)}
	if err := cfg.Log.Append(ents, newHS); err != nil {
		return 0, fmt.Errorf("append the forced membership entries: %w", err)
	}
	cfg.Logger.Info("forcing restart member",
		zap.String("cluster-id", fmt.Sprintf("%x", cfg.ClusterID)),
		zap.String("local-member-id", fmt.Sprintf("%x", cfg.ID)),
		zap.Uint64("wal-commit-index", logCommit),
		zap.Uint64("commit-index", next-1),
		zap.Int("removed-members", len(others)-1))
	return next - 1, nil
}

// confStateAt is the membership raft reaches at index upTo when it starts
// from cs at index from and applies the membership entries in (from, upTo]:
// raft's own confchange rules (RawNode.ApplyConfChange), so that an entry
// raft would refuse is refused here, before anything is written.
func confStateAt(log Log, cs *raftpb.ConfState, from, upTo, last uint64) (*raftpb.ConfState, error) {
	chg := confchange.Changer{Tracker: tracker.MakeProgressTracker(1, 0), LastIndex: last}
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
