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
// raftlog.Log's LastIndex and Append (one sync per call).
type CatchUpLog interface {
	LastIndex() (uint64, error)
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
// that is not empty is left as it is (a restart of a member that caught
// up already): CatchUp returns a zero result.
//
// endpoint is the logger's client URL.
func CatchUp(ctx context.Context, endpoint string, clusterID uint64, log CatchUpLog) (CatchUpResult, error) {
	return CatchUpTLS(ctx, endpoint, nil, clusterID, log)
}

// CatchUpTLS is CatchUp dialling an https endpoint with tlsCfg (DialTLS).
func CatchUpTLS(ctx context.Context, endpoint string, tlsCfg *tls.Config, clusterID uint64, log CatchUpLog) (CatchUpResult, error) {
	var res CatchUpResult
	if last, err := log.LastIndex(); err != nil || last != 0 {
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
