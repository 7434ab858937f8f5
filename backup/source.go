package backup

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/logger"
)

// ErrNotHeld: the source of a point-in-time restore does not hold the
// committed entries the restore needs (the message says which it holds).
var ErrNotHeld = errors.New("backup: the log source does not hold the entries needed")

// ErrIndexRange: a point-in-time restore was asked for a raft index the
// kept versions and the log source cannot rebuild.
var ErrIndexRange = errors.New("backup: raft index out of the restorable range")

// EntrySource is where a point-in-time restore reads the committed raft
// entries that follow a version (docs/backup.md, "Point-in-time restore"):
// the log archived in the target (ArchiveSource) or a logger's Recover
// stream (LoggerSource). The entries are those of the raft log of the
// cluster the version was taken of, which the restore names by its ID.
type EntrySource interface {
	// Held returns the ranges of committed entries of the cluster the
	// source holds, by first index, each a contiguous run.
	Held(ctx context.Context, clusterID uint64) ([]LogRange, error)
	// Entries calls fn with the committed entries first..last of the
	// cluster in index order, until fn says stop or returns an error
	// (returned). An entry of the range it does not hold is an error.
	Entries(ctx context.Context, clusterID, first, last uint64, fn func(*raftpb.Entry) (stop bool, err error)) error
	// String names the source in messages.
	String() string
}

// BatchSource is an EntrySource that may stand for some of the entries
// with compacted batches (a logger's log compaction, docs/logger.md): each
// batch stands for its whole range [FirstIndex, LastIndex], and replaying
// its records on a state at any index inside it gives the state at its
// last index. Batches come first, consecutive, then entries.
type BatchSource interface {
	EntrySource
	// EntriesOrBatches is Entries, with batch called for each compacted
	// batch in place of the entries it stands for.
	EntriesOrBatches(ctx context.Context, clusterID, first, last uint64, entry func(*raftpb.Entry) (stop bool, err error), batch func(*logcompact.Batch) (stop bool, err error)) error
}

// ArchiveSource is the log archived in a target (logarchive.go) as an
// EntrySource. A target holds one cluster's archive: the cluster ID is not
// checked.
type ArchiveSource struct{ Target Target }

// Held returns the archived log objects' ranges, contiguous ones merged.
func (a ArchiveSource) Held(ctx context.Context, _ uint64) ([]LogRange, error) {
	objs, err := ArchivedLog(ctx, a.Target)
	if err != nil {
		return nil, err
	}
	var out []LogRange
	for _, r := range objs {
		if n := len(out); n > 0 && r.First <= out[n-1].Last+1 {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// Entries reads the archived objects holding first..last, each checked
// before its entries are given (decodeLog).
func (a ArchiveSource) Entries(ctx context.Context, _ uint64, first, last uint64, fn func(*raftpb.Entry) (bool, error)) error {
	stopped := false
	next, err := forEachArchived(ctx, a.Target, first, func(e *raftpb.Entry) (bool, error) {
		if e.GetIndex() > last {
			stopped = true
			return true, nil
		}
		stop, err := fn(e)
		stopped = stop
		return stop, err
	})
	if err != nil || stopped || next > last {
		return err
	}
	return fmt.Errorf("%w: the archived log ends at index %d, before %d", ErrLogGap, next-1, last)
}

func (a ArchiveSource) String() string { return "the archived log of " + a.Target.String() }

// LoggerSource is a strata logger (docs/logger.md) as an EntrySource: its
// Status says what it holds of a cluster (the committed entries from its
// first index to its commit index), its Recover stream gives them.
type LoggerSource struct {
	// Client is a client of the logger's API (logger.Dial).
	Client *logger.Client
	// Endpoint is the logger's client URL, for messages.
	Endpoint string
	// ClusterID, if not 0, is the cluster the operator named: a restore
	// of a version taken of another cluster is refused (its raft indexes
	// are another log's).
	ClusterID uint64
}

// Held asks the logger's Status for the cluster: [FirstIndex,
// CommitIndex], or nothing.
func (l LoggerSource) Held(ctx context.Context, clusterID uint64) ([]LogRange, error) {
	if err := l.checkCluster(clusterID); err != nil {
		return nil, err
	}
	st, err := l.Client.Status(ctx, clusterID)
	if status.Code(err) == codes.NotFound {
		all, _ := l.Client.Status(ctx, 0)
		var ids []string
		for _, c := range all {
			ids = append(ids, fmt.Sprintf("%x", c.ClusterID))
		}
		return nil, fmt.Errorf("%w: the logger at %s serves no cluster %x (it serves: %s)", ErrNotHeld, l.Endpoint, clusterID, orNone(ids))
	}
	if err != nil {
		return nil, fmt.Errorf("ask the logger at %s for the status of cluster %x: %w", l.Endpoint, clusterID, err)
	}
	if len(st) != 1 || st[0].CommitIndex < st[0].FirstIndex {
		return nil, nil
	}
	return []LogRange{{First: st[0].FirstIndex, Last: st[0].CommitIndex}}, nil
}

// errStopRecover ends a Recover stream early: fn said stop.
var errStopRecover = errors.New("stop")

// Entries streams first..last from the logger's Recover; a range the
// logger refuses (OutOfRange: a gap, a truncation, past its commit index;
// FailedPrecondition: replaced by log compaction, EntriesOrBatches takes
// it) wraps ErrNotHeld with the logger's reason.
func (l LoggerSource) Entries(ctx context.Context, clusterID, first, last uint64, fn func(*raftpb.Entry) (bool, error)) error {
	return l.EntriesOrBatches(ctx, clusterID, first, last, fn, nil)
}

// EntriesOrBatches streams first..last from the logger's Recover, taking
// compacted batches where the logger's log compaction replaced entries if
// batch is not nil.
func (l LoggerSource) EntriesOrBatches(ctx context.Context, clusterID, first, last uint64, fn func(*raftpb.Entry) (bool, error), batch func(*logcompact.Batch) (bool, error)) error {
	if err := l.checkCluster(clusterID); err != nil {
		return err
	}
	var fnErr error
	each := func(it logger.RecoverItem) error {
		if it.Batch != nil {
			stop, err := batch(it.Batch)
			if err != nil {
				fnErr = err
				return err
			}
			if stop {
				return errStopRecover
			}
			return nil
		}
		for _, e := range it.Entries {
			stop, err := fn(e)
			if err != nil {
				fnErr = err
				return err
			}
			if stop {
				return errStopRecover
			}
		}
		return nil
	}
	var err error
	if batch != nil {
		err = l.Client.RecoverBatches(ctx, clusterID, first, last, each)
	} else {
		err = l.Client.Recover(ctx, clusterID, first, last, func(ents []*raftpb.Entry) error {
			return each(logger.RecoverItem{Entries: ents})
		})
	}
	switch {
	case err == nil, errors.Is(err, errStopRecover):
		return nil
	case fnErr != nil:
		return fnErr
	case status.Code(err) == codes.OutOfRange, status.Code(err) == codes.FailedPrecondition:
		return fmt.Errorf("%w: the logger at %s: %s", ErrNotHeld, l.Endpoint, status.Convert(err).Message())
	}
	return fmt.Errorf("recover entries %d-%d of cluster %x from the logger at %s: %w", first, last, clusterID, l.Endpoint, err)
}

func (l LoggerSource) checkCluster(clusterID uint64) error {
	if l.ClusterID != 0 && l.ClusterID != clusterID {
		return fmt.Errorf("%w: the version was taken of cluster %x, the logger's cluster was named %x: their raft logs differ",
			ErrNotHeld, clusterID, l.ClusterID)
	}
	return nil
}

func (l LoggerSource) String() string { return "the logger at " + l.Endpoint }

// describeHeld writes ranges as "12-340, 400-512" (or "nothing").
func describeHeld(rs []LogRange) string {
	var s []string
	for _, r := range rs {
		s = append(s, fmt.Sprintf("%d-%d", r.First, r.Last))
	}
	return orNone(s)
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "nothing"
	}
	return strings.Join(s, ", ")
}

// heldRun returns the last index of the run of src's entries of cluster
// clusterID that holds index from, after checking that it reaches toIndex
// if that is not 0. A from held by no run is refused (ErrNotHeld if src
// holds entries after it, ErrRevisionRange or ErrIndexRange if it holds
// nothing after it), naming what src holds.
func heldRun(ctx context.Context, src EntrySource, clusterID, from, toIndex uint64, m *Manifest) (uint64, []LogRange, error) {
	held, err := src.Held(ctx, clusterID)
	if err != nil {
		return 0, nil, err
	}
	for _, r := range held {
		if r.First <= from && from <= r.Last {
			if toIndex > r.Last {
				return 0, nil, fmt.Errorf("%w: index %d: %s holds committed entries %s of cluster %x, the replay after version %d (index %d) can reach %d",
					ErrIndexRange, toIndex, src, describeHeld(held), clusterID, m.Version, m.RaftIndex, r.Last)
			}
			return r.Last, held, nil
		}
	}
	sentinel := ErrRevisionRange
	if toIndex != 0 {
		sentinel = ErrIndexRange
	}
	for _, r := range held {
		if r.First > from {
			sentinel = ErrNotHeld
		}
	}
	return 0, nil, fmt.Errorf("%w: the replay after version %d (index %d) needs entry %d on; %s holds committed entries %s of cluster %x",
		sentinel, m.Version, m.RaftIndex, from, src, describeHeld(held), clusterID)
}
