package member

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/raftlog"
)

// LogCompactionConfig configures log compaction (seed 000; DESIGN.md,
// "The log") and recovery from compacted batch files.
type LogCompactionConfig struct {
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
	// RecoveryStrategy is apply.RecoveryNaive (default) or
	// apply.RecoveryDescending (--recovery-strategy).
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

// startupTimes is what start-up measured, for the log line written once
// the raft log is replayed (000's Table 4: where recovery time goes).
type startupTimes struct {
	// logOpen is raftlog.Open: reading and checking every segment.
	logOpen time.Duration
	// replayFrom is the applied index once compacted batches are
	// replayed: raft redelivers the entries after it.
	replayFrom uint64
}

// recoverCompactedBatches replays the compacted batch files the engine has
// not applied, before raft starts: raft's log begins after them. It runs
// whether or not compaction is enabled now, since earlier runs may have
// written batches. The lessor does not exist yet; it loads what the replay
// wrote.
func (m *Member) recoverCompactedBatches() error {
	start := time.Now()
	applied := m.applier.AppliedIndex()
	m.startup.replayFrom = applied
	batches, err := m.log.CompactedBatches(applied)
	if err != nil {
		return fmt.Errorf("read compacted batches: %w", err)
	}
	read := time.Since(start)
	if len(batches) == 0 {
		return nil
	}
	defer func() { m.startup.replayFrom = m.applier.AppliedIndex() }()
	strategy := m.cfg.LogCompaction.RecoveryStrategy
	if strategy == "" {
		strategy = apply.RecoveryNaive
	}
	horizon := m.store.CompactRev()
	if m.cfg.LogCompaction.HistoryLatest {
		horizon = math.MaxInt64
	}
	t, err := m.applier.ReplayCompactedBatches(batches, strategy, horizon, m.leaseMinTTL())
	if err != nil {
		return fmt.Errorf("replay compacted batches: %w", err)
	}
	m.logger.Info("replayed compacted log batches",
		zap.String("strategy", strategy),
		zap.Int("batches", t.Batches),
		zap.Int("records", t.Records),
		zap.Int("records-applied", t.Applied),
		zap.Uint64("from-index", applied),
		zap.Uint64("to-index", m.applier.AppliedIndex()),
		zap.Duration("read-decode", read),
		zap.Duration("select", t.Select),
		zap.Duration("apply", t.Apply))
	return nil
}

// logStartupReplay waits (in a goroutine) until the applier reaches the
// raft log's last index as it was at start-up, and logs how long the
// start-up took: opening the log, and replaying the entries after the
// engine's (and the compacted batches') applied index through raft. With
// one member the entries a crash left uncommitted commit only after the
// election, which this time then includes.
func (m *Member) logStartupReplay(ctx context.Context) {
	target, err := m.log.LastIndex()
	from := m.startup.replayFrom
	if err != nil || target <= from {
		m.logger.Info("opened raft log", zap.Duration("log-open", m.startup.logOpen),
			zap.Uint64("applied-index", from), zap.Int("entries-replayed", 0))
		return
	}
	start := time.Now()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for m.applier.AppliedIndex() < target {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
		m.logger.Info("replayed raft log entries at start-up", zap.Duration("log-open", m.startup.logOpen),
			zap.Uint64("from-index", from), zap.Uint64("to-index", target),
			zap.Uint64("entries-replayed", target-from), zap.Duration("replay", time.Since(start)))
	}()
}

// leaseMinTTL is the lessor's minimum TTL, as member.go computes it for
// lease.Config (a lease outlives an election).
func (m *Member) leaseMinTTL() int64 {
	tick := m.cfg.HeartbeatInterval
	if tick <= 0 {
		return 0
	}
	electionTicks := int(m.cfg.ElectionTimeout / tick)
	minTTL := time.Duration(3*max(electionTicks, 2)/2) * tick
	return int64(math.Ceil(minTTL.Seconds()))
}

// startLogCompaction starts the log compactor: every Interval, if
// enabled, it rewrites the oldest segments whose entries are all applied,
// or every run of BatchEntries applied entries; enabled or not, it drops
// the store's index -> revision rows of indexes the log no longer holds
// (the applier writes one per request).
func (m *Member) startLogCompaction(ctx context.Context) {
	m.logStartupReplay(ctx)
	lc := m.cfg.LogCompaction
	every := lc.Interval
	if every <= 0 {
		every = time.Second
		if lc.BatchEntries > 0 {
			every = 100 * time.Millisecond
		}
	}
	build := func(entries []*raftpb.Entry) (*raftlog.CompactedBatch, error) {
		horizon := m.store.CompactRev()
		if lc.HistoryLatest {
			horizon = math.MaxInt64
		}
		b, err := apply.BuildCompactedBatch(m.store, entries, horizon)
		if errors.Is(err, apply.ErrNotCompactable) {
			return nil, fmt.Errorf("%w: %w", raftlog.ErrSkipSegment, err)
		}
		return b, err
	}
	compact := func() (bool, error) {
		applied := m.applier.AppliedIndex()
		if lc.BatchEntries > 0 {
			// Keep the newest CatchUpEntries applied entries in the log, as
			// the node's log truncation does, so that a follower a little
			// behind catches up from entries, not from a snapshot: batches
			// are small, and compacting up to the applied index would put
			// a follower a few hundred entries behind out of the log's
			// reach. (A whole segment is slack enough on its own.)
			if applied <= m.cfg.CatchUpEntries {
				return false, nil
			}
			return m.log.CompactNextBatch(applied-m.cfg.CatchUpEntries, lc.BatchEntries, build)
		}
		return m.log.CompactOldestSegment(applied, build)
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
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
			for lc.Enabled && ctx.Err() == nil {
				ok, err := compact()
				if err != nil {
					if errors.Is(err, raftlog.ErrClosed) || errors.Is(err, raftlog.ErrFailed) {
						return
					}
					m.logger.Warn("log compaction failed", zap.Error(err))
					break
				}
				if !ok {
					break
				}
			}
			// Rows of indexes the log no longer holds are not needed. At
			// most once a second: each pass is a range deletion in the
			// engine, which batches of a few hundred entries would
			// otherwise multiply.
			if time.Since(lastForget) < time.Second {
				continue
			}
			lastForget = time.Now()
			if first, err := m.log.FirstIndex(); err == nil && first > forgotten+1 {
				if err := m.store.ForgetIndexRevisions(first - 1); err != nil {
					m.logger.Warn("forgetting index revisions failed", zap.Error(err))
				} else {
					forgotten = first - 1
				}
			}
		}
	}()
}
