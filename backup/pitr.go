package backup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/engine/engines"
	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/node"
)

// ErrRevisionRange: a point-in-time restore was asked for a revision the
// kept versions and the archived log cannot rebuild.
var ErrRevisionRange = errors.New("backup: revision out of the restorable range")

// versionForRevision returns the newest version whose revision is at most
// rev.
func versionForRevision(ctx context.Context, t Target, rev int64) (*Manifest, error) {
	list, err := List(ctx, t)
	if err != nil {
		return nil, err
	}
	var best *Manifest
	for _, m := range list {
		if m.Revision <= rev && (best == nil || m.Version > best.Version) {
			best = m
		}
	}
	if best == nil {
		oldest := "none"
		if len(list) > 0 {
			oldest = fmt.Sprint(list[0].Revision)
		}
		return nil, fmt.Errorf("%w: revision %d is before the oldest version's (revision %s)", ErrRevisionRange, rev, oldest)
	}
	return best, nil
}

// versionForIndex returns the newest version whose raft index is at most
// index.
func versionForIndex(ctx context.Context, t Target, index uint64) (*Manifest, error) {
	list, err := List(ctx, t)
	if err != nil {
		return nil, err
	}
	var best *Manifest
	for _, m := range list {
		if m.RaftIndex <= index && (best == nil || m.Version > best.Version) {
			best = m
		}
	}
	if best == nil {
		oldest := "none"
		if len(list) > 0 {
			oldest = fmt.Sprint(list[0].RaftIndex)
		}
		return nil, fmt.Errorf("%w: index %d is before the oldest version's (index %s)", ErrIndexRange, index, oldest)
	}
	return best, nil
}

// replayGoal is where a replay stops: at revision rev, or, if rev is 0,
// at raft index index.
type replayGoal struct {
	rev   int64
	index uint64
}

func (g replayGoal) String() string {
	if g.rev != 0 {
		return fmt.Sprintf("revision %d", g.rev)
	}
	return fmt.Sprintf("index %d", g.index)
}

// replayRunEntries and replayRunBytes bound the entries a replay hands
// the applier at once (one engine batch): enough that the round trip per
// run is noise, few enough that a run of large values stays a few MiB.
const (
	replayRunEntries = 1024
	replayRunBytes   = 4 << 20
)

// replayTo applies the committed entries after version m, read from src
// up to index last (the end of the run src holds: heldRun), to the staged
// engine in engineDir, of the engine named engineName, one at a time as a
// member applies them (an applier with a lessor and the auth store, no
// node), until the goal: the store at
// revision goal.rev (each entry adds at most one revision, so the replay
// stops exactly there: docs/backup.md, "Point-in-time restore"), or entry
// goal.index applied. It returns the index of the last entry applied.
// progress, if it implements ReplayProgress, is told how far it is.
func replayTo(ctx context.Context, src EntrySource, engineDir, engineName string, m *Manifest, goal replayGoal, last uint64, held []LogRange, progress Progress, logger *zap.Logger) (uint64, error) {
	eng, err := engines.Open(engineName, engineDir, engines.Options{Logger: logger.Named("engine")})
	if err != nil {
		return 0, fmt.Errorf("open the downloaded engine: %w", err)
	}
	defer eng.Close()
	store, err := mvcc.Open(eng, mvcc.Options{Logger: logger.Named("mvcc")})
	if err != nil {
		return 0, fmt.Errorf("open the downloaded store: %w", err)
	}
	store.Start()
	defer store.Close()
	// Lease TTLs do not change keys or HashKV; a member with etcd's
	// default timings is as good as any.
	minTTL := lease.MinTTL(100*time.Millisecond, time.Second)
	if applied := store.AppliedIndex(); applied != m.RaftIndex {
		return 0, fmt.Errorf("%w: the files hold applied index %d, the manifest says %d", ErrCorrupt, applied, m.RaftIndex)
	}
	reached := func(applied uint64) bool {
		if goal.rev != 0 {
			return store.Rev() >= goal.rev
		}
		return applied >= goal.index
	}
	// The applier that applies entries one at a time, as a member's does,
	// is set up at the first entry: compacted batches (a logger's log
	// compaction) come before any entry, and are replayed as a member's
	// recovery replays them, by an applier with no lessor that writes the
	// lease records itself; the lessor then loads what they left.
	var app *apply.Applier
	var in chan node.Committed
	var runErr chan error
	stopRun := func() error { return nil }
	setup := func() error {
		lessor := lease.New(lease.Config{MinTTL: minTTL, Logger: logger.Named("lease")})
		if err := lessor.Load(store); err != nil {
			return err
		}
		authStore, err := auth.Open(auth.Flags{}, eng, logger.Named("auth"))
		if err != nil {
			return err
		}
		app, err = apply.New(apply.Config{Store: store, Lessor: lessor, Auth: authStore, Logger: logger.Named("apply")})
		if err != nil {
			return err
		}
		runCtx, cancel := context.WithCancel(ctx)
		in = make(chan node.Committed)
		runErr = make(chan error, 1)
		go func() { runErr <- app.Run(runCtx, in) }()
		stopRun = func() error {
			cancel()
			return <-runErr
		}
		return nil
	}
	applied := m.RaftIndex
	// Entries go to the applier in runs, as a member's node hands them
	// over (one engine batch a run), not one at a time, which cost a
	// round trip to the applier per entry. A run never passes the goal:
	// each entry adds at most one revision, so a run is handed over as
	// soon as the revisions it may add could reach goal.rev (or its last
	// entry is goal.index), and reached is asked again before the next
	// entry joins one.
	var run []*raftpb.Entry
	runBytes := 0
	runMayReach := func() bool {
		if goal.rev != 0 {
			return store.Rev()+int64(len(run)) >= goal.rev
		}
		return applied+uint64(len(run)) >= goal.index
	}
	tracker := newReplayTracker(progress, m, goal, store.Rev)
	applyRun := func() error {
		if len(run) == 0 {
			return nil
		}
		last := run[len(run)-1].GetIndex()
		select {
		case in <- node.Committed{Entries: run}:
		case err := <-runErr:
			return fmt.Errorf("apply entries %d-%d: %w", run[0].GetIndex(), last, err)
		}
		if err := app.WaitApplied(ctx, last); err != nil {
			return fmt.Errorf("apply entries %d-%d: %w", run[0].GetIndex(), last, err)
		}
		applied, run, runBytes = last, nil, 0
		tracker.update(applied)
		return nil
	}
	onEntry := func(e *raftpb.Entry) (bool, error) {
		if reached(applied) {
			return true, nil
		}
		if want := applied + uint64(len(run)) + 1; e.GetIndex() != want {
			return false, fmt.Errorf("%w: entry %d follows entry %d", ErrCorrupt, e.GetIndex(), want-1)
		}
		if app == nil {
			if err := setup(); err != nil {
				return false, err
			}
		}
		run = append(run, e)
		runBytes += len(e.GetData())
		if len(run) >= replayRunEntries || runBytes >= replayRunBytes || runMayReach() {
			return false, applyRun()
		}
		return false, nil
	}
	onBatch := func(b *logcompact.Batch) (bool, error) {
		if reached(applied) {
			return true, nil
		}
		if app != nil || b.FirstIndex > applied+1 || b.LastIndex <= applied {
			return false, fmt.Errorf("%w: compacted batch %d-%d after entry %d", ErrCorrupt, b.FirstIndex, b.LastIndex, applied)
		}
		// A batch stands for its whole range: the states strictly inside
		// it are not to be had (docs/logger.md, "Log compaction").
		if goal.rev == 0 && goal.index < b.LastIndex {
			return false, fmt.Errorf("%w: index %d: %s holds entries %d-%d as one compacted batch (log compaction), and a restore from it reaches index %d or %d, not one between",
				ErrIndexRange, goal.index, src, b.FirstIndex, b.LastIndex, applied, b.LastIndex)
		}
		if goal.rev != 0 && b.Revision > goal.rev {
			return false, fmt.Errorf("%w: revision %d: %s holds entries %d-%d as one compacted batch (log compaction), and a restore from it reaches revision %d or %d, not one between",
				ErrRevisionRange, goal.rev, src, b.FirstIndex, b.LastIndex, store.Rev(), b.Revision)
		}
		authStore, err := auth.Open(auth.Flags{}, eng, logger.Named("auth"))
		if err != nil {
			return false, err
		}
		rep, err := apply.New(apply.Config{Store: store, Auth: authStore, Logger: logger.Named("apply")})
		if err != nil {
			return false, err
		}
		if _, err := logcompact.Replay(rep, []*logcompact.Batch{b}, logcompact.RecoveryNaive, store.CompactRev(), minTTL); err != nil {
			return false, fmt.Errorf("replay compacted batch %d-%d: %w", b.FirstIndex, b.LastIndex, err)
		}
		applied = b.LastIndex
		tracker.update(applied)
		return false, nil
	}
	if bs, ok := src.(BatchSource); ok {
		err = bs.EntriesOrBatches(ctx, uint64(m.ClusterID), m.RaftIndex+1, last, onEntry, onBatch)
	} else {
		err = src.Entries(ctx, uint64(m.ClusterID), m.RaftIndex+1, last, onEntry)
	}
	if err == nil {
		err = applyRun() // what the source ended with
	}
	if rerr := stopRun(); err == nil && rerr != nil {
		err = fmt.Errorf("apply: %w", rerr)
	}
	if err != nil {
		return 0, fmt.Errorf("replay %s after version %d: %w", src, m.Version, err)
	}
	if !reached(applied) {
		// The run src holds ended first: across a gap (entries held after
		// it) or at the end of what src holds.
		sentinel := ErrRevisionRange
		if goal.rev == 0 {
			sentinel = ErrIndexRange
		}
		for _, r := range held {
			if r.First > last+1 {
				sentinel = ErrNotHeld
			}
		}
		return 0, fmt.Errorf("%w: the replay after version %d (revision %d) ends at index %d, revision %d, before %s: %s holds committed entries %s of cluster %x",
			sentinel, m.Version, m.Revision, applied, store.Rev(), goal, src, describeHeld(held), uint64(m.ClusterID))
	}
	if goal.rev != 0 && store.Rev() != goal.rev {
		return 0, fmt.Errorf("%w: entry %d took the store from before revision %d to %d", ErrCorrupt, applied, goal.rev, store.Rev())
	}
	if err := eng.Flush(); err != nil {
		return 0, fmt.Errorf("flush the replayed engine: %w", err)
	}
	return applied, nil
}
