package logger

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// ErrCatchUp means a member cannot catch up from the logger: the logger
// does not hold the cluster's whole committed log from index 1.
var ErrCatchUp = errors.New("logger: cannot catch up from the logger")

// CatchUpLog is the raft log of a member that catches up from a logger:
// raftlog.Log's state, indexes and terms, and Append (one sync per call).
type CatchUpLog interface {
	InitialState() (*raftpb.HardState, *raftpb.ConfState, error)
	FirstIndex() (uint64, error)
	LastIndex() (uint64, error)
	Term(i uint64) (uint64, error)
	Append(entries []*raftpb.Entry, hs *raftpb.HardState) error
}

// CatchUpResult is what CatchUp wrote into the member's log.
type CatchUpResult struct {
	// Last is the last entry appended (the logger's commit index when
	// asked), Term its term; 0 if nothing was.
	Last, Term uint64
	// Entries and Bytes count what was appended.
	Entries, Bytes uint64
}

// CatchUp fills the empty raft log of a member that is joining the cluster
// with the committed entries the logger holds, from index 1 to the commit
// index it knows, before the member's raft starts (docs/logger.md,
// "Catching up from a logger"). Each batch Recover streams is appended
// with a HardState whose commit index is the batch's last entry and whose
// term is that entry's (no vote): every batch appended is a prefix of the
// cluster's committed log, so a crash midway leaves a log the member
// restarts from, and the leader sends it only what follows.
//
// It refuses (ErrCatchUp) a logger that serves no such cluster or holds
// the log only from after index 1 (it joined late, a gap, a truncation):
// the member's state machine is empty, so it needs every entry; and one
// whose log compaction replaced entries with compacted batches (a raft
// log needs the entries; a point-in-time restore takes the batches).
// Should compaction replace entries while they stream, Recover refuses
// the rest (FailedPrecondition) and so does CatchUp, leaving a log that
// is a committed prefix, as after a crash midway. A log
// that is not empty is a restart: CatchUp then brings it up to the
// logger's commit index (catchUpRestart), or leaves it as it is.
//
// endpoint is the logger's client URL.
func CatchUp(ctx context.Context, endpoint string, clusterID uint64, log CatchUpLog) (CatchUpResult, error) {
	return CatchUpTLS(ctx, endpoint, nil, clusterID, log)
}

// CatchUpTLS is CatchUp dialling an https endpoint with tlsCfg (DialTLS).
func CatchUpTLS(ctx context.Context, endpoint string, tlsCfg *tls.Config, clusterID uint64, log CatchUpLog) (CatchUpResult, error) {
	var res CatchUpResult
	last, err := log.LastIndex()
	if err != nil {
		return res, err
	}
	c, err := DialTLS(endpoint, tlsCfg)
	if err != nil {
		return res, fmt.Errorf("%w: %w", ErrCatchUp, err)
	}
	defer c.Close()
	sts, err := c.Status(ctx, clusterID)
	if err != nil {
		return res, fmt.Errorf("%w: the logger at %s: status of cluster %x: %w", ErrCatchUp, endpoint, clusterID, err)
	}
	if len(sts) != 1 {
		return res, fmt.Errorf("%w: the logger answered %d clusters for %x", ErrCatchUp, len(sts), clusterID)
	}
	st := sts[0]
	if last != 0 {
		return catchUpRestart(ctx, c, endpoint, st, clusterID, log)
	}
	if st.FirstIndex != 1 || st.CommitIndex == 0 {
		held := "nothing committed"
		if st.CommitIndex >= st.FirstIndex && st.CommitIndex > 0 {
			held = fmt.Sprintf("committed entries %d-%d", st.FirstIndex, st.CommitIndex)
		}
		return res, fmt.Errorf("%w: the logger at %s holds %s of cluster %x; a member with an empty state needs every entry from 1 (start it without the logger: the leader sends it a snapshot)",
			ErrCatchUp, endpoint, held, clusterID)
	}
	if st.CompactedBatches > 0 {
		// A member's log needs the entries themselves (raft replays them,
		// configuration changes included); compacted batches stand for
		// them only to a state machine (docs/logger.md, "Log compaction").
		return res, fmt.Errorf("%w: the logger at %s holds entries %d-%d of cluster %x as compacted batches (its log compaction), which a member's raft log cannot take (start it without the logger: the leader sends it a snapshot)",
			ErrCatchUp, endpoint, st.CompactedFirst, st.CompactedLast, clusterID)
	}
	err = c.Recover(ctx, clusterID, 1, st.CommitIndex, func(ents []*raftpb.Entry) error {
		last := ents[len(ents)-1]
		hs := &raftpb.HardState{Term: proto.Uint64(last.GetTerm()), Commit: proto.Uint64(last.GetIndex())}
		if err := log.Append(ents, hs); err != nil {
			return fmt.Errorf("append entries %d-%d: %w", ents[0].GetIndex(), last.GetIndex(), err)
		}
		res.Last, res.Term = last.GetIndex(), last.GetTerm()
		res.Entries += uint64(len(ents))
		for _, e := range ents {
			res.Bytes += uint64(len(e.GetData()))
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("%w: the logger at %s: recover [1, %d] of cluster %x: %w", ErrCatchUp, endpoint, st.CommitIndex, clusterID, err)
	}
	return res, nil
}

// catchUpRestart brings the log of a member restarting with its data kept
// up to the logger's commit index, so that a member that was down while
// the leader truncated its log past the member's last entry gets the
// entries it missed from the logger and not a snapshot from the leader
// (issue 12, part 5). It returns a zero result, with no error, when the
// logger is not ahead of the member's commit index, and ErrCatchUp when
// the logger does not hold the entries from there (the leader's snapshot
// remains the way; the member starts anyway).
//
// Only committed entries are appended, each batch with a HardState that
// commits it, so every write leaves a log the member restarts from:
//
//  1. The copy starts after what this log knows to be committed: its
//     HardState's commit index, or the entry before its first if the log
//     was truncated past that (a truncation is below the engine's durable
//     index, which is applied, which is committed).
//  2. An entry of the logger whose index and term this log holds already
//     is that same entry (raft's Log Matching property) and is skipped.
//     At the first that differs, this log's entry was never committed (the
//     logger's is): Append replaces this log from there on, as a follower
//     does when its leader's entries conflict with its own.
//  3. The HardState keeps this member's term and vote unless an entry's
//     term is higher (then the vote, cast in an older term, is dropped):
//     a member must never go back in term, nor vote twice in one.
func catchUpRestart(ctx context.Context, c *Client, endpoint string, st *ClusterStatus, clusterID uint64, log CatchUpLog) (CatchUpResult, error) {
	var res CatchUpResult
	hs, _, err := log.InitialState()
	if err != nil {
		return res, err
	}
	first, err := log.FirstIndex()
	if err != nil {
		return res, err
	}
	last, err := log.LastIndex()
	if err != nil {
		return res, err
	}
	from := max(hs.GetCommit(), first-1) + 1
	if st.CommitIndex < from {
		return res, nil
	}
	if st.FirstIndex > from || (st.CompactedBatches > 0 && st.CompactedLast >= from) {
		return res, fmt.Errorf("%w: the logger at %s holds committed entries %d-%d of cluster %x (compacted batches up to %d); this member's log needs them from %d",
			ErrCatchUp, endpoint, st.FirstIndex, st.CommitIndex, clusterID, st.CompactedLast, from)
	}
	term, vote := hs.GetTerm(), hs.GetVote()
	// appending: this log's own entries are behind us (they all matched,
	// or one differed and Append replaced the rest), so every entry the
	// logger sends from here on is appended.
	appending := false
	err = c.Recover(ctx, clusterID, from, st.CommitIndex, func(ents []*raftpb.Entry) error {
		for !appending && len(ents) > 0 && ents[0].GetIndex() <= last {
			t, err := log.Term(ents[0].GetIndex())
			if err != nil {
				return fmt.Errorf("term of entry %d: %w", ents[0].GetIndex(), err)
			}
			if t != ents[0].GetTerm() {
				break
			}
			ents = ents[1:]
		}
		if len(ents) == 0 {
			return nil
		}
		end := ents[len(ents)-1]
		if end.GetTerm() > term {
			term, vote = end.GetTerm(), 0
		}
		hs := &raftpb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(vote), Commit: proto.Uint64(end.GetIndex())}
		if err := log.Append(ents, hs); err != nil {
			return fmt.Errorf("append entries %d-%d: %w", ents[0].GetIndex(), end.GetIndex(), err)
		}
		appending = true
		res.Last, res.Term = end.GetIndex(), end.GetTerm()
		res.Entries += uint64(len(ents))
		for _, e := range ents {
			res.Bytes += uint64(len(e.GetData()))
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("%w: the logger at %s: recover [%d, %d] of cluster %x: %w", ErrCatchUp, endpoint, from, st.CommitIndex, clusterID, err)
	}
	return res, nil
}
