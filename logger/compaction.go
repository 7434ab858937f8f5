package logger

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/auth"
	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/node"
	"github.com/strata-kv/strata/raftlog"
)

// Log compaction of a cluster's log (docs/logger.md, "Log compaction").
//
// strata's log compaction (package logcompact, seed 000) rewrites a run of
// applied entries as one record per key state, read from a store that
// applied them (mvcc.Store.Changes, from the index -> revision rows the
// applier writes). A logger has no state machine, so with
// Config.LogCompaction.Enabled it keeps one per cluster for this alone: a
// compactor applies the committed entries the learner logged to a store of
// its own (<cluster>/compaction/state, a Pebble engine, no WAL), and
// rewrites runs of them as compacted batch files in the cluster's raftlog,
// exactly as a member's compactor does, with three differences:
//
//   - the batches keep every entry they cannot merge verbatim (membership
//     changes, auth and alarm requests: logcompact.BuildOptions.KeepAll),
//     since a logger's log is truncated only when the voters ask, and a
//     run left uncompacted would hold compaction back for good;
//   - once a batch is written, the store compacts its own history up to
//     the batch's revision: the next batch needs only the versions after
//     it, so the store holds about the cluster's current state, not its
//     history;
//   - the cluster's revision compactions are not applied to the store
//     (neutralize): a member's compactor leaves a run that a revision
//     compaction reached as entries until its own log truncation passes
//     it (mvcc.ErrChangesCompacted), which a logger may never do, and the
//     store applies whole runs at once after a restart. The batches keep
//     the compaction entries verbatim (whoever replays them compacts), and
//     the history horizon is the highest revision the cluster compacted
//     at, as on a member (clusterCompactRev; forgotten on a restart, when
//     it falls back to the store's own compaction point, which drops
//     less, never more).
//
// Invariants:
//
//  1. A batch stands only for entries the store applied, which are
//     committed, durable in the log, and handed over by the learner's raft
//     (min(commit, delivered)): raft never needs an entry the compactor
//     removed.
//  2. The store's applied index never passes the log: entries are read
//     from the log. At open, batches above the store's applied index (the
//     store lost its unflushed tail in a crash) are replayed first
//     (logcompact.Recover), as a member does.
//  3. If the log no longer holds the entries after the store's applied
//     index (a gap, or a truncation at the voters' request that passed
//     it), compaction stops for the cluster and Status says why: batches
//     built from a store that missed entries would be wrong.
type compactor struct {
	cfg logcompact.Config
	id  uint64
	log *raftlog.Log
	ln  *learner
	lg  *zap.Logger

	eng    *pebbleengine.Engine
	store  *mvcc.Store
	app    *apply.Applier
	minTTL int64

	// stopped is why compaction stopped for good (invariant 3); "" while
	// it runs. Published for Status.
	stopped atomic.Pointer[string]
	// lastRev is the revision of the last batch built (self-compaction).
	lastRev int64
	// clusterCompactRev is the highest revision the cluster compacted at
	// that the compactor saw applied (neutralize): the history horizon.
	clusterCompactRev int64

	closeOnce sync.Once
}

// compactionDirName is the compactor's directory in a cluster's.
const compactionDirName = "compaction"

// openCompactor opens the cluster's compaction state, replaying the
// batches its store has not applied. A log that does not reach back to
// what the store applied (or, for a new store, to index 1) gives a
// compactor that is stopped from the start, with the reason.
func openCompactor(cfg logcompact.Config, dir string, id uint64, log *raftlog.Log, lg *zap.Logger) (*compactor, error) {
	c := &compactor{cfg: cfg, id: id, log: log, lg: lg, minTTL: lease.MinTTL(100*time.Millisecond, time.Second)}
	eng, err := pebbleengine.Open(filepath.Join(dir, compactionDirName, "state"), pebbleengine.Options{Logger: lg.Named("engine")})
	if err != nil {
		return nil, fmt.Errorf("open the compaction state: %w", err)
	}
	c.eng = eng
	fail := func(err error) (*compactor, error) {
		c.close()
		return nil, err
	}
	c.store, err = mvcc.Open(eng, mvcc.Options{Logger: lg.Named("mvcc")})
	if err != nil {
		return fail(fmt.Errorf("open the compaction state's store: %w", err))
	}
	c.store.Start()
	applied := c.store.AppliedIndex()
	first, _ := log.FirstIndex()
	cfirst, clast, n := log.CompactedRange()
	held := first
	if n > 0 {
		held = cfirst
	}
	if applied+1 < held {
		c.stop(fmt.Sprintf("the log holds the cluster's entries from %d on, the compaction state applied up to %d (a gap or a truncation): it cannot build batches any more", held, applied))
		return c, nil
	}
	authStore, err := auth.Open(auth.Flags{}, eng, lg.Named("auth"))
	if err != nil {
		return fail(err)
	}
	if n > 0 && clast > applied {
		// Invariant 2: an applier with no lessor, as a member's recovery.
		rec, err := apply.New(apply.Config{Store: c.store, Auth: authStore, Logger: lg.Named("apply")})
		if err != nil {
			return fail(err)
		}
		if _, err := logcompact.Recover(cfg, log, c.store, rec, c.minTTL, lg); err != nil {
			return fail(fmt.Errorf("compaction state: %w", err))
		}
		if authStore, err = auth.Open(auth.Flags{}, eng, lg.Named("auth")); err != nil {
			return fail(err)
		}
	}
	lessor := lease.New(lease.Config{MinTTL: c.minTTL, Logger: lg.Named("lease")})
	if err := lessor.Load(c.store); err != nil {
		return fail(err)
	}
	c.app, err = apply.New(apply.Config{Store: c.store, Lessor: lessor, Auth: authStore, Logger: lg.Named("apply")})
	if err != nil {
		return fail(err)
	}
	return c, nil
}

func (c *compactor) stop(reason string) {
	if c.stopped.CompareAndSwap(nil, &reason) {
		c.lg.Warn("log compaction stopped for this cluster", zap.String("reason", reason))
	}
}

// stoppedReason is why compaction stopped, "" if it did not.
func (c *compactor) stoppedReason() string {
	if p := c.stopped.Load(); p != nil {
		return *p
	}
	return ""
}

// run applies and compacts until ctx ends or compaction stops.
func (c *compactor) run(ctx context.Context) {
	if c.app == nil {
		return // stopped at open
	}
	every := c.cfg.Interval
	if every <= 0 {
		every = time.Second
		if c.cfg.BatchEntries > 0 {
			every = 100 * time.Millisecond
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	in := make(chan node.Committed)
	runErr := make(chan error, 1)
	go func() { runErr <- c.app.Run(runCtx, in) }()
	defer func() {
		cancel()
		<-runErr
	}()
	tick := time.NewTicker(every)
	defer tick.Stop()
	var lastForget time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-runErr:
			c.stop(fmt.Sprintf("applying to the compaction state failed: %v", err))
			runErr <- nil
			return
		case <-tick.C:
		}
		if err := c.applyCommitted(ctx, in); err != nil {
			if ctx.Err() == nil {
				c.stop(err.Error())
			}
			return
		}
		for ctx.Err() == nil {
			ok, err := c.compactOnce()
			if err != nil {
				if errors.Is(err, raftlog.ErrClosed) || errors.Is(err, raftlog.ErrFailed) {
					return
				}
				c.lg.Warn("log compaction failed", zap.Error(err))
				break
			}
			if !ok {
				break
			}
		}
		if time.Since(lastForget) >= time.Second {
			lastForget = time.Now()
			if first, err := c.log.FirstIndex(); err == nil && first > 1 {
				if err := c.store.ForgetIndexRevisions(first - 1); err != nil {
					c.lg.Warn("forgetting index revisions failed", zap.Error(err))
				}
			}
		}
	}
}

// applyCommitted applies the entries the learner logged, committed and
// handed over (invariant 1), reading them from the log (invariant 2).
func (c *compactor) applyCommitted(ctx context.Context, in chan<- node.Committed) error {
	upTo := min(c.ln.commit.Load(), c.ln.deliveredIndex.Load())
	for applied := c.app.AppliedIndex(); applied < upTo; applied = c.app.AppliedIndex() {
		ents, err := c.log.Entries(applied+1, upTo+1, 4<<20)
		if errors.Is(err, raft.ErrCompacted) {
			// Invariant 3.
			first, _ := c.log.FirstIndex()
			return fmt.Errorf("the log holds entries from %d on, the compaction state applied up to %d (a gap or a truncation): it cannot build batches any more", first, applied)
		}
		if err != nil {
			return fmt.Errorf("read entries %d-%d to compact: %w", applied+1, upTo, err)
		}
		if len(ents) == 0 {
			return nil
		}
		ents = c.neutralize(ents)
		select {
		case in <- node.Committed{Entries: ents}:
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := c.app.WaitApplied(ctx, ents[len(ents)-1].GetIndex()); err != nil {
			return err
		}
	}
	return nil
}

// neutralize returns ents with every revision compaction made one that
// changes nothing (at revision 0, which the store refuses as compacted:
// the applier still records the entry's index row), and notes the
// revision the cluster compacted at for the horizon. The log keeps the
// entries as they are.
func (c *compactor) neutralize(ents []*raftpb.Entry) []*raftpb.Entry {
	var out []*raftpb.Entry
	for i, e := range ents {
		if e.GetType() != raftpb.EntryNormal || len(e.GetData()) == 0 {
			continue
		}
		var req pb.InternalRaftRequest
		if err := proto.Unmarshal(e.GetData(), &req); err != nil || req.Compaction == nil {
			continue // the applier reports what does not decode
		}
		// A compaction at a revision the store has reached succeeded
		// (a later one only if at or below the revision at its entry,
		// which the store's revision before the run underestimates:
		// the horizon is then lower, which drops less).
		if rev := req.Compaction.Revision; rev <= c.store.Rev() {
			c.clusterCompactRev = max(c.clusterCompactRev, rev)
		}
		req.Compaction = &pb.CompactionRequest{Revision: 0}
		raw, err := proto.Marshal(&req)
		if err != nil {
			continue
		}
		if out == nil {
			out = append([]*raftpb.Entry(nil), ents...)
		}
		ne := proto.CloneOf(e)
		ne.Data = raw
		out[i] = ne
	}
	if out == nil {
		return ents
	}
	return out
}

// compactOnce writes the next batch if one is due, then compacts the
// store's history up to the batch's revision. Only run's goroutine calls
// it, while the applier is idle.
func (c *compactor) compactOnce() (bool, error) {
	applied := c.app.AppliedIndex()
	var ok bool
	var err error
	if c.cfg.BatchEntries > 0 {
		ok, err = c.log.CompactNextBatch(applied, c.cfg.BatchEntries, c.build)
	} else {
		ok, err = c.log.CompactOldestSegment(applied, c.build)
	}
	if err != nil || !ok {
		return ok, err
	}
	if c.lastRev > c.store.CompactRev() {
		w := c.store.Write(nil)
		if _, _, err := w.Compact(&pb.CompactionRequest{Revision: c.lastRev}); err != nil {
			w.Abort()
		} else if err := w.Commit(c.store.AppliedIndex()); err != nil {
			return ok, fmt.Errorf("compact the compaction state's history at %d: %w", c.lastRev, err)
		}
	}
	return ok, nil
}

// build is the raftlog.BatchBuilder.
func (c *compactor) build(entries []*raftpb.Entry) (*raftlog.CompactedBatch, error) {
	horizon := max(c.store.CompactRev(), c.clusterCompactRev)
	if c.cfg.HistoryLatest {
		horizon = 1<<63 - 1
	}
	b, err := logcompact.BuildWith(c.store, entries, horizon, logcompact.BuildOptions{KeepAll: true})
	if errors.Is(err, logcompact.ErrNotCompactable) {
		return nil, fmt.Errorf("%w: %w", raftlog.ErrSkipSegment, err)
	}
	if err != nil {
		return nil, err
	}
	c.lastRev = b.Revision
	return logcompact.EncodeBatch(b)
}

// close closes the store and its engine. The goroutine has ended.
func (c *compactor) close() {
	c.closeOnce.Do(func() {
		if c.store != nil {
			_ = c.store.Close()
		}
		if c.eng != nil {
			_ = c.eng.Close()
		}
	})
}
