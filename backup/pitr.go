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
	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/lease"
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

// replayTo applies the committed entries after version m, read from src
// up to index last (the end of the run src holds: heldRun), to the staged
// engine in engineDir, one at a time as a member applies them (an applier
// with a lessor and the auth store, no node), until the goal: the store at
// revision goal.rev (each entry adds at most one revision, so the replay
// stops exactly there: docs/backup.md, "Point-in-time restore"), or entry
// goal.index applied. It returns the index of the last entry applied.
func replayTo(ctx context.Context, src EntrySource, engineDir string, m *Manifest, goal replayGoal, last uint64, held []LogRange, logger *zap.Logger) (uint64, error) {
	eng, err := pebbleengine.Open(engineDir, pebbleengine.Options{Logger: logger.Named("engine")})
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
	lessor := lease.New(lease.Config{MinTTL: lease.MinTTL(100*time.Millisecond, time.Second), Logger: logger.Named("lease")})
	if err := lessor.Load(store); err != nil {
		return 0, err
	}
	authStore, err := auth.Open(auth.Flags{}, eng, logger.Named("auth"))
	if err != nil {
		return 0, err
	}
	app, err := apply.New(apply.Config{Store: store, Lessor: lessor, Auth: authStore, Logger: logger.Named("apply")})
	if err != nil {
		return 0, err
	}
	if app.AppliedIndex() != m.RaftIndex {
		return 0, fmt.Errorf("%w: the files hold applied index %d, the manifest says %d", ErrCorrupt, app.AppliedIndex(), m.RaftIndex)
	}
	reached := func(applied uint64) bool {
		if goal.rev != 0 {
			return store.Rev() >= goal.rev
		}
		return applied >= goal.index
	}
	runCtx, cancel := context.WithCancel(ctx)
	in := make(chan node.Committed)
	runErr := make(chan error, 1)
	go func() { runErr <- app.Run(runCtx, in) }()
	stopRun := func() error {
		cancel()
		return <-runErr
	}
	applied := m.RaftIndex
	err = src.Entries(ctx, uint64(m.ClusterID), m.RaftIndex+1, last, func(e *raftpb.Entry) (bool, error) {
		if reached(applied) {
			return true, nil
		}
		if e.GetIndex() != applied+1 {
			return false, fmt.Errorf("%w: entry %d follows entry %d", ErrCorrupt, e.GetIndex(), applied)
		}
		select {
		case in <- node.Committed{Entries: []*raftpb.Entry{e}}:
		case err := <-runErr:
			return false, fmt.Errorf("apply entry %d: %w", e.GetIndex(), err)
		}
		if err := app.WaitApplied(ctx, e.GetIndex()); err != nil {
			return false, fmt.Errorf("apply entry %d: %w", e.GetIndex(), err)
		}
		applied = e.GetIndex()
		return false, nil
	})
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
