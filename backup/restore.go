package backup

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/engines"
	"github.com/strata-kv/strata/maintenance"
	"github.com/strata-kv/strata/snapshot"
)

// RestoreConfig says which version to restore and which new member and
// cluster the new data directory starts, in etcdutl snapshot restore's
// terms (as maintenance.RestoreConfig).
type RestoreConfig struct {
	// Version to restore; 0 means the latest.
	Version uint64
	// ToRevision, if not 0, restores the state at that revision instead:
	// the newest version at or before it, then the archived raft log
	// replayed up to it (docs/backup.md, "Point-in-time restore"). It
	// excludes Version.
	ToRevision int64
	// ToTime, if not zero, restores the last state at or before that
	// wall-clock time that the archived time samples show: the newest
	// version created at or before it, then the archived log up to the
	// last index a sample says was applied by then (docs/backup.md,
	// "Point-in-time restore"). It excludes Version and ToRevision.
	ToTime time.Time
	// ToIndex, if not 0, restores the state after raft entry ToIndex
	// instead: the newest version at or before it, then the committed
	// entries after it up to ToIndex. It excludes Version and ToRevision.
	ToIndex uint64
	// Source is where a restore to a revision or an index reads the
	// committed entries after the version. nil: the log archived in the
	// target (ArchiveSource).
	Source EntrySource
	// DataDir is the new data directory; it must not exist.
	DataDir string
	// Engine is the engine of the new data directory (--engine); empty
	// means the version's own. The version's files are read with the
	// engine that wrote them and exported into this one, so a version of
	// one engine restores onto any other.
	Engine string
	// Name, InitialCluster and InitialClusterToken give the new member
	// and cluster IDs, as at a cluster's bootstrap: a new cluster ID
	// unless the same members and token are given again.
	Name                string
	InitialCluster      map[string][]string
	InitialClusterToken string
	Logger              *zap.Logger
	// Progress, if not nil, is told the version's files and bytes, then
	// the bytes as they download and each file once checked.
	Progress Progress
}

// RestoreResult describes a restored data directory.
type RestoreResult struct {
	maintenance.RestoreResult
	// Manifest is the version restored.
	Manifest *Manifest
	// ReplayedTo is the index of the last entry replayed after the
	// version (point-in-time restore), 0 if none was.
	ReplayedTo uint64
	// StateTime, after a restore to a time, is when the restored state
	// is known to have been the live one: the time of the last sample at
	// or before ToTime, or the version's creation.
	StateTime time.Time
	// Source names where the replayed entries came from.
	Source string
}

// Restore builds a new data directory from a version in t (FORMAT.md,
// "Restore"): it downloads every file of the version into a staging
// directory beside DataDir, checking each against its hash and size, then
// rewrites the staged engine into DataDir through maintenance.Restore,
// which drops the old cluster's membership, conf state, alarms and index
// rows, zeroes the applied index and writes the new identity. A member
// started on DataDir with the same --name, --initial-cluster and
// --initial-cluster-token bootstraps the new cluster's raft log over the
// restored data.
//
// An existing DataDir, a missing version, a missing or corrupt file are
// errors, and leave neither DataDir nor the staging directory behind.
func Restore(ctx context.Context, t Target, cfg RestoreConfig) (RestoreResult, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.DataDir == "" {
		return RestoreResult{}, errors.New("restore: no data directory given")
	}
	if _, err := os.Stat(cfg.DataDir); err == nil {
		return RestoreResult{}, fmt.Errorf("restore: data-dir %q exists; restore builds a new one", cfg.DataDir)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return RestoreResult{}, fmt.Errorf("restore: %w", err)
	}
	if _, ok := cfg.InitialCluster[cfg.Name]; !ok {
		return RestoreResult{}, fmt.Errorf("restore: --initial-cluster has no member named %q (--name)", cfg.Name)
	}
	asked := 0
	for _, given := range []bool{cfg.Version != 0, cfg.ToRevision != 0, cfg.ToIndex != 0, !cfg.ToTime.IsZero()} {
		if given {
			asked++
		}
	}
	if asked > 1 {
		return RestoreResult{}, errors.New("restore: give one of a version, a revision, an index or a time")
	}
	if cfg.Source == nil {
		cfg.Source = ArchiveSource{Target: t}
	}
	var m *Manifest
	var err error
	var plan timePlan
	switch {
	case !cfg.ToTime.IsZero():
		if _, archive := cfg.Source.(ArchiveSource); !archive {
			return RestoreResult{}, fmt.Errorf("restore: a time is found in the archive's time samples, not in %s", cfg.Source)
		}
		if plan, err = planToTime(ctx, t, cfg.ToTime); err != nil {
			return RestoreResult{}, fmt.Errorf("restore to %s: %w", cfg.ToTime.Format(timeFormat), err)
		}
		m = plan.version
	case cfg.ToRevision != 0:
		m, err = versionForRevision(ctx, t, cfg.ToRevision)
	case cfg.ToIndex != 0:
		m, err = versionForIndex(ctx, t, cfg.ToIndex)
	default:
		m, err = ReadManifest(ctx, t, cfg.Version)
	}
	if err != nil {
		return RestoreResult{}, fmt.Errorf("restore: %w", err)
	}
	goal := replayGoal{rev: cfg.ToRevision, index: cfg.ToIndex}
	if !cfg.ToTime.IsZero() {
		goal.index = plan.index // the last index a sample shows applied by then
	}
	replay := goal.rev > m.Revision || goal.index > m.RaftIndex
	// What the source holds after the version is checked before any file
	// is downloaded.
	var runLast uint64
	var held []LogRange
	if replay {
		if runLast, held, err = heldRun(ctx, cfg.Source, uint64(m.ClusterID), m.RaftIndex+1, goal.index, m); err != nil {
			return RestoreResult{}, fmt.Errorf("restore to %s: %w", goal, err)
		}
		if goal.index != 0 {
			runLast = goal.index
		}
	}
	// A log version restores its base's files, then replays its own log
	// (FORMAT.md, "Log versions"): both are checked to be there before
	// anything is downloaded.
	files := m
	if m.IsLog() {
		if files, err = baseOf(ctx, t, m); err != nil {
			return RestoreResult{}, fmt.Errorf("restore version %d: %w", m.Version, err)
		}
		if err := statLog(ctx, t, m); err != nil {
			return RestoreResult{}, fmt.Errorf("restore version %d: %w", m.Version, err)
		}
	}
	staging := filepath.Clean(cfg.DataDir) + ".download"
	if err := os.RemoveAll(staging); err != nil {
		return RestoreResult{}, fmt.Errorf("restore: remove the leftover of an earlier restore: %w", err)
	}
	defer os.RemoveAll(staging)
	engineDir := filepath.Join(staging, "engine")
	if err := datadir.MkdirAllSynced(vfs.Default, engineDir); err != nil {
		return RestoreResult{}, fmt.Errorf("restore: %w", err)
	}
	progress := progressOr(cfg.Progress)
	progress.Total(len(files.Files), files.Size())
	for _, f := range files.Files {
		// Manifest.check allowed only paths below engineDir.
		p := filepath.Join(engineDir, filepath.FromSlash(f.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return RestoreResult{}, fmt.Errorf("restore version %d: %w", m.Version, err)
		}
		if err := download(ctx, t, f, p, progress); err != nil {
			return RestoreResult{}, fmt.Errorf("restore version %d: %w", m.Version, err)
		}
		progress.Done(1, 0)
	}
	if m.IsLog() {
		if err := replayVersion(ctx, t, engineDir, files, m, progress, cfg.Logger); err != nil {
			return RestoreResult{}, fmt.Errorf("restore version %d: %w", m.Version, err)
		}
	}
	applied, replayed := m.RaftIndex, uint64(0)
	if replay {
		if replayed, err = replayTo(ctx, cfg.Source, engineDir, files.EngineName(), m, goal, runLast, held, progress, cfg.Logger); err != nil {
			return RestoreResult{}, fmt.Errorf("restore to %s: %w", goal, err)
		}
		applied = replayed
	}
	eng, err := engines.Open(files.EngineName(), engineDir, engines.Options{ReadOnly: files.EngineName() == pebbleEngine, Logger: cfg.Logger.Named("engine")})
	if err != nil {
		return RestoreResult{}, fmt.Errorf("restore version %d: open the downloaded engine: %w", m.Version, err)
	}
	defer eng.Close()
	res, err := maintenance.Restore(maintenance.RestoreConfig{
		Source:              engineSource(eng, applied),
		Engine:              cmp.Or(cfg.Engine, files.EngineName()),
		Name:                cfg.Name,
		DataDir:             cfg.DataDir,
		InitialCluster:      cfg.InitialCluster,
		InitialClusterToken: cfg.InitialClusterToken,
		Logger:              cfg.Logger,
	})
	if err != nil {
		return RestoreResult{}, fmt.Errorf("restore version %d: %w", m.Version, err)
	}
	return RestoreResult{RestoreResult: res, Manifest: m, ReplayedTo: replayed, StateTime: plan.at, Source: cfg.Source.String()}, nil
}

// replayVersion replays log version m's own log on its base's files in
// engineDir, to m's index, and checks that the replay reached the
// revision and compact revision m recorded from the live member's
// checkpoint at that index: a log that replays to another state is
// refused as corrupt.
func replayVersion(ctx context.Context, t Target, engineDir string, base, m *Manifest, progress Progress, logger *zap.Logger) error {
	if m.RaftIndex > base.RaftIndex {
		src := versionLog{t: t, m: m}
		held, err := src.Held(ctx, uint64(m.ClusterID))
		if err != nil {
			return err
		}
		if _, err := replayTo(ctx, src, engineDir, base.EngineName(), base, replayGoal{index: m.RaftIndex}, m.RaftIndex, held, progress, logger); err != nil {
			return fmt.Errorf("replay the log after base version %d: %w", base.Version, err)
		}
	}
	got, err := readCheckpointMeta(base.EngineName(), engineDir)
	if err != nil {
		return err
	}
	if got.RaftIndex != m.RaftIndex || got.Revision != m.Revision || got.CompactRevision != m.CompactRevision {
		return fmt.Errorf("%w: base version %d and the log replayed give index %d, revision %d, compact revision %d; the manifest says %d, %d, %d",
			ErrCorrupt, base.Version, got.RaftIndex, got.Revision, got.CompactRevision, m.RaftIndex, m.Revision, m.CompactRevision)
	}
	return nil
}

// engineSource gives maintenance.Restore every key of the downloaded
// engine, the reserved ones included, from one consistent view, which
// must hold applied index applied (the version's, or the last replayed).
func engineSource(eng engine.Transferable, applied uint64) maintenance.RestoreSource {
	return func(sink snapshot.Sink) (uint64, uint64, error) {
		v, err := eng.NewExportView()
		if err != nil {
			return 0, 0, err
		}
		defer v.Close()
		if v.AppliedIndex() != applied {
			return 0, 0, fmt.Errorf("%w: the files hold applied index %d, want %d", ErrCorrupt, v.AppliedIndex(), applied)
		}
		var n uint64
		err = v.ForEach(func(key, value []byte) error {
			n++
			return sink.Add(key, value)
		})
		if err != nil {
			return 0, 0, err
		}
		return v.AppliedIndex(), n, nil
	}
}

// download writes the file f of a version to p, checking its size and
// hash as it goes, and syncs it; progress is told the bytes as they come.
func download(ctx context.Context, t Target, f File, p string, progress Progress) error {
	r, err := t.Get(ctx, fileName(f.SHA256))
	if err != nil {
		return fmt.Errorf("download %s: %w", f.Name, err)
	}
	defer r.Close()
	out, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("download %s: %w", f.Name, err)
	}
	h := sha256.New()
	// One byte more than the size, to see a longer object.
	n, err := io.Copy(io.MultiWriter(out, h, progressWriter{progress}), io.LimitReader(&ctxReader{ctx: ctx, r: r}, f.Size+1))
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("download %s: %w", f.Name, err)
	}
	if err := checkContent(f, n, h.Sum(nil)); err != nil {
		return fmt.Errorf("download %s: %w", f.Name, err)
	}
	return nil
}

// checkContent compares what was read of f's object with its manifest
// entry.
func checkContent(f File, n int64, sum []byte) error {
	switch {
	case n > f.Size:
		return fmt.Errorf("%w: %s holds more than the %d bytes the manifest says", ErrCorrupt, fileName(f.SHA256), f.Size)
	case n < f.Size:
		return fmt.Errorf("%w: %s holds %d bytes, the manifest says %d", ErrCorrupt, fileName(f.SHA256), n, f.Size)
	}
	if got := hex.EncodeToString(sum); got != f.SHA256 {
		return fmt.Errorf("%w: %s has sha256 %s", ErrCorrupt, fileName(f.SHA256), got)
	}
	return nil
}
