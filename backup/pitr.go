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

// replayLimit is where a replay stops: at a revision (Revision, not 0)
// or after an index (Index).
type replayLimit struct {
	Revision int64
	Index    uint64
}

// reached reports whether the replay stops before entry e, the store being
// at revision rev.
func (l replayLimit) reached(rev int64, e *raftpb.Entry) bool {
	if l.Revision != 0 {
		return rev >= l.Revision
	}
	return e.GetIndex() > l.Index
}

// replayTo applies the archived entries after version m to the staged
// engine in engineDir, one at a time as a member applies them (an
// applier with a lessor and the auth store, no node), until lim: a
// revision (each entry adds at most one revision, so the replay stops
// exactly there) or an index (docs/backup.md, "Point-in-time restore").
// It returns the index of the last entry applied.
func replayTo(ctx context.Context, t Target, engineDir string, m *Manifest, lim replayLimit, logger *zap.Logger) (uint64, error) {
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
	runCtx, cancel := context.WithCancel(ctx)
	in := make(chan node.Committed)
	runErr := make(chan error, 1)
	go func() { runErr <- app.Run(runCtx, in) }()
	stopRun := func() error {
		cancel()
		return <-runErr
	}
	applied := m.RaftIndex
	_, err = forEachArchived(ctx, t, m.RaftIndex+1, func(e *raftpb.Entry) (bool, error) {
		if lim.reached(store.Rev(), e) {
			return true, nil
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
		return 0, fmt.Errorf("replay the archived log after version %d: %w", m.Version, err)
	}
	if got := store.Rev(); lim.Revision != 0 && got != lim.Revision {
		return 0, fmt.Errorf("%w: the archived log after version %d (revision %d) ends at index %d, revision %d, before revision %d",
			ErrRevisionRange, m.Version, m.Revision, applied, got, lim.Revision)
	}
	if lim.Revision == 0 && applied != lim.Index {
		return 0, fmt.Errorf("%w: the archived log after version %d ends at index %d, before index %d", ErrLogGap, m.Version, applied, lim.Index)
	}
	if err := eng.Flush(); err != nil {
		return 0, fmt.Errorf("flush the replayed engine: %w", err)
	}
	return applied, nil
}
