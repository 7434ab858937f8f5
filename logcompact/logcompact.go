// Package logcompact is log compaction (seed 000, Xavier, "Efficient Log
// Compaction by Safely Discarding Commands"; docs/design.md, "The history
// horizon"; docs/log-compaction.md): runs of applied raft log entries are
// rewritten as batches that hold one record per key state instead of
// every command, and replayed at start-up, before raft redelivers the
// entries after them, with either recovery strategy.
//
// It owns the idea whole: the batch payload format and its decoder for
// older releases' files (batch.go, legacy.go, FORMAT.md), the builder
// (build.go), both recovery strategies (replay.go), the background
// Compactor with the invariants it shares with MVCC compaction, and
// Recover (this file). It leans on three packages that keep their own
// parts: the raft log stores a batch as an opaque, checksummed payload
// with its index range and term (raftlog, compactlog.go and batchfile.go),
// mvcc answers which key versions a run of revisions wrote
// (mvcc/logcompact.go), and the applier writes a replayed run, as kept
// entries apply as it applies them (apply.Applier.ReplayRun, through the
// Replayer interface).
package logcompact

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/raftlog"
)

// Config configures log compaction and recovery from compacted batch
// files (the --log-compaction flags).
type Config struct {
	// Enabled runs the log compactor (--log-compaction): sealed segments
	// whose entries are applied are rewritten as compacted batch files.
	Enabled bool
	// HistoryLatest (--history latest) drops every write superseded within
	// a batch, not only those at or below the compact revision. A member
	// that replays such batches (a restart, an incremental install) raises
	// its compact revision over the versions they dropped, so reads at those
	// revisions are refused as compacted there: use it with clients that
	// never read history.
	HistoryLatest bool
	// RecoveryStrategy is RecoveryNaive (default) or RecoveryDescending
	// (--recovery-strategy).
	RecoveryStrategy string
	// BatchEntries (--log-compaction-batch), if not 0, makes the unit of
	// log compaction a run of that many applied entries after the log's
	// snapshot point (raftlog.CompactNextBatch: 000's batches of N
	// commands) instead of a whole sealed segment. The newest
	// Config.CatchUpEntries applied entries stay in the log for followers.
	BatchEntries uint64
	// Interval is the time between compaction passes; 0 means 1 s for
	// segments and 100 ms for batches of BatchEntries (a batch is small,
	// and entries wait in the segments until their batch is written).
	Interval time.Duration
	// SegmentSize is the raft log's segment size, the unit of compaction
	// unless BatchEntries is set; 0 means raftlog.DefaultSegmentSize.
	SegmentSize int64
}

// horizon is the revision at or below which a batch may drop superseded
// writes: the store's compact revision, or every revision with
// --history latest.
func (c Config) horizon(store *mvcc.Store) int64 {
	if c.HistoryLatest {
		return math.MaxInt64
	}
	return store.CompactRev()
}

// Recovery is what Recover did.
type Recovery struct {
	// From is the engine's applied index before the replay, To after it:
	// raft redelivers the entries after To.
	From, To uint64
}

// Recover replays the compacted batch files the engine has not applied,
// before raft starts: raft's log begins after them. It runs whether or not
// compaction is enabled now, since earlier runs may have written batches.
// replayer is an applier with nothing attached (no lessor: it writes lease
// records itself, with minTTL); the lessor and the running applier load
// what the replay wrote.
func Recover(cfg Config, log *raftlog.Log, store *mvcc.Store, replayer Replayer, minTTL int64, logger *zap.Logger) (Recovery, error) {
	start := time.Now()
	applied := replayer.AppliedIndex()
	rec := Recovery{From: applied, To: applied}
	files, err := log.CompactedBatches(applied)
	if err != nil {
		return rec, fmt.Errorf("read compacted batches: %w", err)
	}
	batches := make([]*Batch, 0, len(files))
	for _, f := range files {
		b, err := DecodeBatch(f)
		if err != nil {
			return rec, fmt.Errorf("read compacted batches: %w", err)
		}
		batches = append(batches, b)
	}
	read := time.Since(start)
	if len(batches) == 0 {
		return rec, nil
	}
	strategy := cfg.RecoveryStrategy
	if strategy == "" {
		strategy = RecoveryNaive
	}
	t, err := Replay(replayer, batches, strategy, cfg.horizon(store), minTTL)
	if err != nil {
		return rec, fmt.Errorf("replay compacted batches: %w", err)
	}
	rec.To = replayer.AppliedIndex()
	logger.Info("replayed compacted log batches",
		zap.String("strategy", strategy),
		zap.Int("batches", t.Batches),
		zap.Int("records", t.Records),
		zap.Int("records-applied", t.Applied),
		zap.Uint64("from-index", applied),
		zap.Uint64("to-index", rec.To),
		zap.Duration("read-decode", read),
		zap.Duration("select", t.Select),
		zap.Duration("apply", t.Apply))
	return rec, nil
}

// Applied reports the state machine's applied index (the applier's).
type Applied interface {
	AppliedIndex() uint64
}

// AwaitReplay waits until the applier reaches the raft log's last index
// as it was at start-up, and logs how long the start-up took: opening the
// log (logOpen), and replaying the entries after the engine's (and the
// compacted batches') applied index through raft (000's Table 4: where
// recovery time goes). With one member the entries a crash left
// uncommitted commit only after the election, which this time then
// includes. It returns early when ctx ends.
func (r Recovery) AwaitReplay(ctx context.Context, log *raftlog.Log, applied Applied, logOpen time.Duration, logger *zap.Logger) {
	target, err := log.LastIndex()
	if err != nil || target <= r.To {
		logger.Info("opened raft log", zap.Duration("log-open", logOpen),
			zap.Uint64("applied-index", r.To), zap.Int("entries-replayed", 0))
		return
	}
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for applied.AppliedIndex() < target {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	logger.Info("replayed raft log entries at start-up", zap.Duration("log-open", logOpen),
		zap.Uint64("from-index", r.To), zap.Uint64("to-index", target),
		zap.Uint64("entries-replayed", target-r.To), zap.Duration("replay", time.Since(start)))
}

// CompactorConfig is a Compactor's collaborators.
type CompactorConfig struct {
	Config
	Log   *raftlog.Log
	Store *mvcc.Store
	// Applied is the applier, whose applied index bounds what may be
	// compacted (invariant 1).
	Applied Applied
	// CatchUpEntries are kept as entries below the applied index with
	// BatchEntries (invariant 1).
	CatchUpEntries uint64
	// Retention, if not nil (a member's --logger-retention), bounds what
	// may be compacted by what the cluster's strata loggers hold
	// (invariant 6).
	Retention Retention
	Logger    *zap.Logger
}

// Retention is what holds log compaction back for the cluster's strata
// loggers (node.Node.LogKeptFor).
type Retention interface {
	// LogKeptFor returns the lowest index the loggers hold, and whether
	// they hold the log back at all.
	LogKeptFor() (index uint64, held bool)
}

// Compactor rewrites applied runs of the raft log as compacted batch files,
// in the background: every Interval, if enabled, the oldest segments whose
// entries are all applied, or every run of BatchEntries applied entries;
// enabled or not, it drops the store's index -> revision rows of indexes
// the log no longer holds (the applier writes one per request).
//
// Invariants (with the packages that keep each):
//
//  1. A batch stands only for applied entries: it is built up to the
//     applied index, and with BatchEntries the newest CatchUpEntries
//     applied entries stay entries, so that a follower a little behind
//     catches up from them (this loop).
//  2. The history horizon: a batch drops a write only when a later write
//     to the same key in the batch supersedes it at or below the horizon
//     (the store's compact revision; every revision with --history
//     latest), and it records the compact revision a replay must raise to
//     (Build, Replay).
//  3. A batch is never built over entries whose history revision
//     compaction has already removed from the store: the range stays in
//     the log instead (mvcc.ErrChangesCompacted -> ErrNotCompactable ->
//     raftlog.ErrSkipSegment), since a replay on an older engine state
//     would miss the removed versions.
//  4. A batch file is durable before the segment it replaces is removed,
//     and the log's truncation after an engine flush drops batch files
//     only at or below the engine's durable index (raftlog).
//  5. Index -> revision rows are dropped only below the log's first index:
//     building a batch needs the revision at its first entry (this loop).
//  6. With Retention (--logger-retention), a batch never stands for an
//     entry past the lowest index the cluster's strata loggers hold: the
//     leader sends a logger entries from the log, and a batch would make it
//     send a snapshot instead, which the logger records as a gap (this
//     loop; the node keeps the same bound for its truncation).
type Compactor struct {
	cfg CompactorConfig
}

// NewCompactor returns a compactor; Run runs it.
func NewCompactor(cfg CompactorConfig) *Compactor {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Compactor{cfg: cfg}
}

// build is the raftlog.BatchBuilder: a batch of entries at the horizon
// now (invariants 2 and 3).
func (c *Compactor) build(entries []*raftpb.Entry) (*raftlog.CompactedBatch, error) {
	b, err := Build(c.cfg.Store, entries, c.cfg.horizon(c.cfg.Store))
	if errors.Is(err, ErrNotCompactable) {
		return nil, fmt.Errorf("%w: %w", raftlog.ErrSkipSegment, err)
	}
	if err != nil {
		return nil, err
	}
	return EncodeBatch(b)
}

// compactOnce writes the next batch, if one is due; ok reports whether it
// wrote one.
func (c *Compactor) compactOnce() (ok bool, err error) {
	upTo := c.compactableUpTo()
	if upTo == 0 {
		return false, nil
	}
	if c.cfg.BatchEntries > 0 {
		return c.cfg.Log.CompactNextBatch(upTo, c.cfg.BatchEntries, c.build)
	}
	return c.cfg.Log.CompactOldestSegment(upTo, c.build)
}

// compactableUpTo is the highest index a batch may stand for now
// (invariants 1 and 6); 0: none.
func (c *Compactor) compactableUpTo() uint64 {
	upTo := c.cfg.Applied.AppliedIndex()
	if c.cfg.BatchEntries > 0 {
		// Invariant 1. Batches are small, and compacting up to the
		// applied index would put a follower a few hundred entries behind
		// out of the log's reach; a whole segment is slack enough.
		if upTo <= c.cfg.CatchUpEntries {
			return 0
		}
		upTo -= c.cfg.CatchUpEntries
	}
	if c.cfg.Retention != nil {
		if kept, held := c.cfg.Retention.LogKeptFor(); held {
			upTo = min(upTo, kept)
		}
	}
	return upTo
}

// Run compacts until ctx ends or the log is closed.
func (c *Compactor) Run(ctx context.Context) {
	every := c.cfg.Interval
	if every <= 0 {
		every = time.Second
		if c.cfg.BatchEntries > 0 {
			every = 100 * time.Millisecond
		}
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var forgotten uint64
	var lastForget time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for c.cfg.Enabled && ctx.Err() == nil {
			ok, err := c.compactOnce()
			if err != nil {
				if errors.Is(err, raftlog.ErrClosed) || errors.Is(err, raftlog.ErrFailed) {
					return
				}
				c.cfg.Logger.Warn("log compaction failed", zap.Error(err))
				break
			}
			if !ok {
				break
			}
		}
		// Invariant 5. At most once a second: each pass is a range
		// deletion in the engine, which batches of a few hundred entries
		// would otherwise multiply.
		if time.Since(lastForget) < time.Second {
			continue
		}
		lastForget = time.Now()
		if first, err := c.cfg.Log.FirstIndex(); err == nil && first > forgotten+1 {
			if err := c.cfg.Store.ForgetIndexRevisions(first - 1); err != nil {
				c.cfg.Logger.Warn("forgetting index revisions failed", zap.Error(err))
			} else {
				forgotten = first - 1
			}
		}
	}
}
