package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/engines"
	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/internal/failpoint"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/raftlog"
)

// Checkpointer is the engine as a backup sees it: engine.Engine's
// Checkpoint, a consistent copy of the engine's files in a new directory
// (flushed first, since the WAL is off: docs/design.md, durability rule 3)
// and the applied index the copy holds.
type Checkpointer interface {
	Checkpoint(dir string) (appliedIndex uint64, err error)
}

// Config is everything a Backuper works with, given at construction.
type Config struct {
	// Engine is the engine to back up: a running member's, or a stopped
	// member's opened read-only (CreateOffline).
	Engine Checkpointer
	// Target receives the versions.
	Target Target
	// ID is the identity of the data directory (datadir.ReadID), recorded
	// in each manifest.
	ID datadir.ID
	// Term, if not nil, gives the term of the raft entry at an index (a
	// running member: its raft log's Term, the raft.Storage method). An
	// error or nil Term records term 0: unknown (FORMAT.md).
	Term func(index uint64) (uint64, error)
	// StagingDir is where checkpoints are taken, each in a new directory
	// removed afterwards. It must be on the engine's file system, so that
	// Pebble hard-links the tables instead of copying them; empty means
	// os.TempDir().
	StagingDir string
	// Now is the clock for manifests' creation times; nil is time.Now.
	Now    func() time.Time
	Logger *zap.Logger
	// Progress, if not nil, is told the checkpoint's files and bytes,
	// then each file once it is hashed and, if the target lacked it,
	// uploaded.
	Progress Progress

	// Log, if not nil, is the member's raft log (raftlog.Log): a version
	// may then be a log version (Policy; FORMAT.md, "Log versions").
	Log LogSource
	// Samples, if not nil, are the member's time samples, carried by the
	// log objects a log version archives (as ArchiveLog's).
	Samples *Sampler
	// Policy says when a version may be a log version; the zero Policy
	// takes files versions only.
	Policy Policy

	// counters, if not nil, are shared with other Backupers (a Service's).
	counters *counters
}

// Backuper takes versions of one engine into one target.
//
// Invariants (FORMAT.md, "Invariants"):
//  1. A manifest is written last, only after every file it names is
//     durable in the target: Create uploads the files the target lacks,
//     each Put returning only once the object is durable, and puts the
//     manifest only after the last of them succeeded. A failure before
//     that leaves only files no manifest names, which the next Create
//     reuses (the upload resumes where it stopped) and Prune removes.
//     Every file, uploaded or found present, is checked again just before
//     the manifest and uploaded if it went (another writer's prune).
//  2. Files are never overwritten (Put creates only if absent; a name is
//     its content's hash) and never deleted while a kept manifest names
//     them (Prune deletes manifests first, then only unnamed files).
//  3. A version number is never reused: the next version is one more than
//     the highest manifest in the target, the manifest's Put fails rather
//     than overwrite, and Prune never deletes the newest manifest.
//  4. A log version's manifest is written only after every log object it
//     names is durable in the target and hashed from the bytes written
//     (or read back and checked, for an object another run wrote), and
//     after its base's manifest and each reused object were seen once
//     more; its objects continue each other from its base's index + 1 to
//     its own index, which is the checkpoint's applied index, so that its
//     revision, compact revision and conf state are read from that
//     checkpoint, as a files version's are. Its base is a files version:
//     a restore never chains more than one log on one set of files.
//  5. Prune keeps the base of every kept log version and every log object
//     a kept log version names.
//
// Concurrency: Create and Prune may be called from any goroutine; calls
// are serialised. It runs alongside the applier: the checkpoint is consistent
// by itself.
type Backuper struct {
	cfg Config
	mu  sync.Mutex // serialises Create; guards sums
	// sums remembers the hash of every immutable engine file (tables and
	// blob files) hashed so far, by name and size: Pebble never reuses a
	// file number in one engine and never changes such a file, so a
	// continuous backup hashes only the files created since the last one
	// instead of the whole engine every time. Guarded by mu.
	sums map[fileKey]string
	// logSums remembers the hash and size of each log object this
	// Backuper wrote or read back and checked, by object name: objects are
	// never overwritten, so a log version names an object it saw before
	// without reading it again. Guarded by mu.
	logSums map[string]LogObject
	// stats are the counters Stats reads: the Backuper's own, or shared
	// with the other Backupers of a Service.
	stats *counters
}

// fileKey is one regular file of a checkpoint: its path below the
// checkpoint's directory, with "/" between parts (File.Name), and its size.
// It names an immutable engine file in sums.
type fileKey struct {
	name string
	size int64
}

// immutable reports whether Pebble never rewrites the file name once
// written (tables and blob files); MANIFEST, OPTIONS and markers change.
func immutable(name string) bool {
	ext := filepath.Ext(name)
	return ext == ".sst" || ext == ".blob"
}

// Stats returns the Backuper's counters; safe from any goroutine.
func (b *Backuper) Stats() Stats { return b.stats.read() }

// Run takes a version every interval until ctx is done, then returns
// ctx's error; a failed version is logged, counted (Stats.Failures) and
// tried again at the next tick, where the upload resumes (invariant 1).
// With keep set (KeepLast, KeepWithin or Exponential), every version is followed by
// b.Prune, which never overlaps a Create.
func (b *Backuper) Run(ctx context.Context, interval time.Duration, keep Retention) error {
	if interval <= 0 {
		return fmt.Errorf("backup: interval %s, want more than 0", interval)
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		b.once(ctx, keep)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// once is one turn of Run: a version, then a prune if keep says to.
// Failures are logged and counted.
func (b *Backuper) once(ctx context.Context, keep Retention) {
	if _, err := b.Create(ctx); err != nil {
		if ctx.Err() == nil {
			b.cfg.Logger.Warn("backup: version failed; next try at the next interval", zap.Error(err))
		}
		return
	}
	if keep.any() {
		if _, err := b.Prune(ctx, keep); err != nil {
			b.cfg.Logger.Warn("backup: prune failed", zap.Error(err))
		}
	}
}

// New returns a Backuper; it starts nothing.
func New(cfg Config) *Backuper {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	st := cfg.counters
	if st == nil {
		st = &counters{}
	}
	return &Backuper{cfg: cfg, stats: st, logSums: map[string]LogObject{}}
}

// Create takes a new version: a checkpoint of the engine, then, as the
// Policy says, either the files the target lacks or the raft log since the
// target's last version, then the manifest. It returns the manifest
// written.
func (b *Backuper) Create(ctx context.Context) (*Manifest, error) {
	return b.CreateKind(ctx, "")
}

// CreateKind is Create with the kind of version asked for: "" as the
// Policy says, KindFiles always a files version, KindLog a log version or
// an error wrapping ErrNoLogVersion that says why none can be taken (the
// policy's rules do not apply to an explicit request, except that the
// member's log must hold the entries).
func (b *Backuper) CreateKind(ctx context.Context, kind Kind) (*Manifest, error) {
	if kind != "" && kind != KindFiles && kind != KindLog {
		return nil, fmt.Errorf("backup: version kind %q, want %q or %q", kind, KindFiles, KindLog)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	start := time.Now()
	m, err := b.create(ctx, kind)
	if err != nil {
		b.stats.failures.Add(1)
		return nil, err
	}
	b.stats.succeeded(m, time.Since(start))
	return m, nil
}

// Prune runs Prune on the Backuper's target, serialised with Create: a
// member that takes versions prunes through its Backuper, so that a prune
// never deletes a file a version being written found present and did not
// upload (package comment, "Concurrency").
func (b *Backuper) Prune(ctx context.Context, r Retention) (PruneReport, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return Prune(ctx, b.cfg.Target, r)
}

// create is CreateKind under mu.
func (b *Backuper) create(ctx context.Context, kind Kind) (*Manifest, error) {
	staging, err := os.MkdirTemp(b.cfg.StagingDir, stagingPrefix)
	if err != nil {
		return nil, fmt.Errorf("backup: staging directory: %w", err)
	}
	defer os.RemoveAll(staging)
	cpDir := filepath.Join(staging, "engine")
	applied, err := b.cfg.Engine.Checkpoint(cpDir)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	// After the checkpoint: every entry it holds was applied by then, so
	// a restore to a time at or after created may start from it
	// (docs/backup.md, "Point-in-time restore", rule 8).
	created := b.cfg.Now().UTC()
	engineName := b.cfg.ID.EngineName()
	m, err := readCheckpointMeta(engineName, cpDir)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if m.RaftIndex != applied {
		return nil, fmt.Errorf("backup: checkpoint reads applied index %d, the engine said %d", m.RaftIndex, applied)
	}
	m.Created = created
	m.ClusterID, m.MemberID = ID(b.cfg.ID.ClusterID), ID(b.cfg.ID.MemberID)
	if engineName != pebbleEngine {
		m.Engine = engineName
	}
	if b.cfg.Term != nil && applied > 0 {
		if term, err := b.cfg.Term(applied); err == nil {
			m.RaftTerm = term
		} else {
			b.cfg.Logger.Info("backup: term of the applied entry unknown", zap.Uint64("index", applied), zap.Error(err))
		}
	}
	t := b.cfg.Target
	entries, err := checkpointFiles(cpDir)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	for _, e := range entries {
		m.EngineBytes += e.size
	}
	if kind != KindFiles {
		lm, why, err := b.tryLog(ctx, m, kind == KindLog)
		if err != nil || lm != nil {
			return lm, err
		}
		if kind == KindLog {
			return nil, fmt.Errorf("%w: %s", ErrNoLogVersion, why)
		}
		b.cfg.Logger.Info("backup: a files version", zap.String("why", why))
	}
	total := m.EngineBytes
	m.Kind, m.EngineBytes = KindFiles, 0 // a files version's size is its files'
	progress := progressOr(b.cfg.Progress)
	progress.Total(len(entries), total)
	// sums becomes b.sums: the hashes of this checkpoint's immutable
	// files, so that the cache forgets the tables compacted away.
	sums := map[fileKey]string{}
	defer func() { b.sums = sums }()
	// recheck are the files the manifest will name, uploaded or found
	// present: checked again before the manifest.
	type recheckFile struct {
		path, name, sum string
		size            int64
		uploaded        bool // by this Create, and counted in NewFiles
	}
	var recheck []recheckFile
	for _, e := range entries {
		p := filepath.Join(cpDir, filepath.FromSlash(e.name))
		sum, size, err := b.hash(p, e, engineName == pebbleEngine, sums)
		if err != nil {
			return nil, fmt.Errorf("backup: %w", err)
		}
		m.Files = append(m.Files, File{Name: e.name, SHA256: sum, Size: size})
		uploaded, err := putFileIfAbsent(ctx, t, p, sum, size)
		if err != nil {
			return nil, fmt.Errorf("backup: upload %s: %w", e.name, err)
		}
		if uploaded {
			failpoint.Hit("backup/after-file-upload")
			m.NewFiles++
			m.NewBytes += uint64(size)
			b.stats.filesUploaded.Add(1)
			b.stats.bytesUploaded.Add(uint64(size))
		} else {
			b.stats.filesReused.Add(1)
		}
		recheck = append(recheck, recheckFile{path: p, name: e.name, sum: sum, size: size, uploaded: uploaded})
		progress.Done(1, size)
	}
	// Invariant 1 with another writer: a member that leads no longer may
	// still prune this target (docs/backup.md, "Which member backs up"),
	// deleting a file found present above, or one uploaded above, which no
	// manifest names yet. Each file is checked again and uploaded if it
	// went, which leaves only the time between this check and the
	// manifest's Put.
	for _, f := range recheck {
		uploaded, err := putFileIfAbsent(ctx, t, f.path, f.sum, f.size)
		if err != nil {
			return nil, fmt.Errorf("backup: upload %s: %w", f.name, err)
		}
		if uploaded {
			b.cfg.Logger.Warn("backup: a file went from the target before the manifest; uploaded again (another writer pruning?)",
				zap.String("file", f.name), zap.String("sha256", f.sum))
			if !f.uploaded {
				m.NewFiles++
				m.NewBytes += uint64(f.size)
			}
			b.stats.filesUploaded.Add(1)
			b.stats.bytesUploaded.Add(uint64(f.size))
		}
	}
	last, err := latestVersion(ctx, t)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	m.Version = last + 1
	raw, err := EncodeManifest(m)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	// Invariant 1: every file is durable in the target by now.
	failpoint.Hit("backup/before-manifest")
	if err := t.Put(ctx, manifestName(m.Version), bytes.NewReader(raw), int64(len(raw))); err != nil {
		return nil, fmt.Errorf("backup: write manifest of version %d: %w", m.Version, err)
	}
	b.cfg.Logger.Info("backup: version written", zap.Uint64("version", m.Version), zap.Uint64("index", m.RaftIndex),
		zap.Int64("revision", m.Revision), zap.Int("files", len(m.Files)), zap.Uint64("new-files", m.NewFiles), zap.Uint64("new-bytes", m.NewBytes))
	return m, nil
}

// hash returns the hex SHA-256 and size of the checkpoint's file at p,
// from b.sums for an immutable file hashed before, and records an
// immutable file's hash in next. Only Pebble's files are known immutable
// by name (pebble set): every file of another engine is hashed each time.
// REQUIRES: b.mu held.
func (b *Backuper) hash(p string, key fileKey, pebble bool, next map[fileKey]string) (string, int64, error) {
	cacheable := pebble && immutable(key.name)
	if sum, ok := b.sums[key]; ok && cacheable {
		next[key] = sum
		return sum, key.size, nil
	}
	sum, size, err := hashFile(p)
	if err != nil {
		return "", 0, err
	}
	b.stats.bytesHashed.Add(uint64(size))
	if cacheable && size == key.size {
		next[key] = sum
	}
	return sum, size, nil
}

// checkpointFiles lists every file below dir, in lexical order of their
// paths; anything other than a regular file or a directory (a symbolic
// link) is refused, as no engine's checkpoint holds one.
func checkpointFiles(dir string) ([]fileKey, error) {
	var out []fileKey
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("checkpoint holds %s, not a regular file", rel)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, fileKey{name: filepath.ToSlash(rel), size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list checkpoint: %w", err)
	}
	return out, nil
}

// putFileIfAbsent uploads the file at p as files/<sum> unless the target
// has it, and reports whether it uploaded. An object already there of
// another size is corrupt: it is reported, never overwritten (invariant 2).
func putFileIfAbsent(ctx context.Context, t Target, p, sum string, size int64) (bool, error) {
	name := fileName(sum)
	obj, err := t.Stat(ctx, name)
	switch {
	case err == nil:
		if obj.Size != size {
			return false, fmt.Errorf("%w: %s holds %d bytes, its hash says %d", ErrCorrupt, name, obj.Size, size)
		}
		return false, nil
	case !errors.Is(err, ErrNotExist):
		return false, err
	}
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	// The file is read a second time here (it was hashed first): a table
	// is immutable and the checkpoint is ours, so the bytes are the same.
	if err := t.Put(ctx, name, f, size); err != nil {
		if errors.Is(err, ErrExist) {
			return false, nil // another writer's identical bytes
		}
		return false, err
	}
	return true, nil
}

// hashFile returns the hex SHA-256 and size of the file at p.
func hashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", p, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// readCheckpointMeta opens the checkpoint of the engine named engineName
// in dir and reads the raft and MVCC state it holds, as a member starting
// on it would: the applied index, the conf state the applier keeps, the
// revision and the compact revision. Reading the copy, not the live
// engine, makes them exactly the checkpoint's.
//
// Pebble's checkpoint is opened read-only. The other engines have no
// read-only mode: the checkpoint, a private copy, is opened and closed
// (appendlog and hybridlog write a new active file and hint files, bbolt
// its meta page), which leaves it holding the same state at the same
// applied index; what is uploaded afterwards is the directory as the
// engine left it.
func readCheckpointMeta(engineName, dir string) (*Manifest, error) {
	eng, err := openCheckpoint(engineName, dir)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	defer eng.Close()
	cluster, err := apply.ReadClusterState(eng)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	revs, err := mvcc.ReadRevisionState(eng)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	return &Manifest{
		RaftIndex:       eng.AppliedIndex(),
		ConfState:       confStateOf(cluster.ConfState),
		Revision:        revs.Rev,
		CompactRevision: revs.CompactRev,
	}, nil
}

// openCheckpoint opens the checkpoint of the engine named engineName in
// dir: Pebble's read-only, another engine's for writing (it has no
// read-only mode).
func openCheckpoint(engineName, dir string) (engine.Transferable, error) {
	return engines.Open(engineName, dir, engines.Options{ReadOnly: engineName == pebbleEngine})
}

// latestVersion returns the highest version whose manifest the target
// holds, 0 if none.
func latestVersion(ctx context.Context, t Target) (uint64, error) {
	objs, err := t.List(ctx, manifestsPrefix)
	if err != nil {
		return 0, err
	}
	var last uint64
	for _, o := range objs {
		if v, ok := parseManifestName(o.Name); ok {
			last = max(last, v)
		}
	}
	return last, nil
}

// versions returns the versions whose manifests the target holds, in
// increasing order.
func versions(ctx context.Context, t Target) ([]uint64, error) {
	objs, err := t.List(ctx, manifestsPrefix)
	if err != nil {
		return nil, err
	}
	var out []uint64
	for _, o := range objs {
		if v, ok := parseManifestName(o.Name); ok {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out, nil
}

// ReadManifest reads and checks the manifest of version (0: the latest).
func ReadManifest(ctx context.Context, t Target, version uint64) (*Manifest, error) {
	if version == 0 {
		last, err := latestVersion(ctx, t)
		if err != nil {
			return nil, err
		}
		if last == 0 {
			return nil, fmt.Errorf("%s holds no backup version", t)
		}
		version = last
	}
	r, err := t.Get(ctx, manifestName(version))
	if errors.Is(err, ErrNotExist) {
		return nil, fmt.Errorf("%s has no version %d: %w", t, version, ErrNotExist)
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	raw, err := io.ReadAll(io.LimitReader(r, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read manifest of version %d: %w", version, err)
	}
	m, err := DecodeManifest(raw)
	if err != nil {
		return nil, fmt.Errorf("version %d: %w", version, err)
	}
	if m.Version != version {
		return nil, fmt.Errorf("%w: %s holds version %d", ErrCorrupt, manifestName(version), m.Version)
	}
	return m, nil
}

// CreateOffline backs up the data directory of a stopped member into t:
// it refuses a directory a running member holds (its LOCK), takes the
// checkpoint from a copy of the engine, so no file of the data directory
// changes, and reads
// the term of the applied entry from the raft log (without changing it;
// a log split over several --log-dir is not read, and the term is then
// recorded as unknown). The version holds what the engine had flushed: a
// member stopped cleanly flushes everything it applied; one that was
// killed holds less, and the raft log the rest.
func CreateOffline(ctx context.Context, dataDir string, t Target, logger *zap.Logger, progress Progress) (*Manifest, error) {
	if logger == nil {
		logger = zap.NewNop()
	}
	id, ok, err := datadir.ReadID(vfs.Default, dataDir)
	if err != nil {
		return nil, fmt.Errorf("backup %s: %w", dataDir, err)
	}
	if !ok {
		return nil, fmt.Errorf("backup %s: not a strata data directory (no identity file)", dataDir)
	}
	lock, err := vfs.Default.Lock(datadir.Lock(dataDir))
	if err != nil {
		return nil, fmt.Errorf("backup %s: is a member running on it? %w", dataDir, err)
	}
	defer lock.Close()
	// The engine is copied first (Pebble's tables hard-linked, the rest
	// copied) and the copy opened: a read-only Pebble DB cannot take a
	// checkpoint, and opening the member's own engine for writing would
	// change its files.
	staging, err := os.MkdirTemp(filepath.Dir(filepath.Clean(dataDir)), ".strata-backup-")
	if err != nil {
		return nil, fmt.Errorf("backup %s: staging directory: %w", dataDir, err)
	}
	defer os.RemoveAll(staging)
	copyDir := filepath.Join(staging, "engine")
	engineName := id.EngineName()
	var eng interface {
		Checkpointer
		Close() error
	}
	if engineName == pebbleEngine {
		if err := copyEngine(datadir.Engine(dataDir), copyDir); err != nil {
			return nil, fmt.Errorf("backup %s: %w", dataDir, err)
		}
		eng, err = pebbleengine.Open(copyDir, pebbleengine.Options{Logger: logger.Named("engine"), CacheSize: 8 << 20})
	} else {
		if err := copyTree(datadir.Engine(dataDir), copyDir); err != nil {
			return nil, fmt.Errorf("backup %s: %w", dataDir, err)
		}
		eng, err = engines.Open(engineName, copyDir, engines.Options{Logger: logger.Named("engine")})
	}
	if err != nil {
		return nil, fmt.Errorf("backup %s: open a copy of the engine: %w", dataDir, err)
	}
	defer eng.Close()
	b := New(Config{Engine: eng, Target: t, ID: id, Term: offlineTerm(datadir.Log(dataDir)), StagingDir: staging, Logger: logger,
		Progress: progress})
	return b.Create(ctx)
}

// copyEngine copies a stopped engine's directory from src to the new dst:
// tables and blob files, which Pebble never changes once written, as hard
// links (copied if the link fails); every other file (MANIFEST, OPTIONS,
// markers), which an open engine rewrites or appends to, as a copy. The
// engine's LOCK is left out.
func copyEngine(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("copy engine: %w", err)
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("copy engine: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if name == "LOCK" || !e.Type().IsRegular() {
			continue
		}
		from, to := filepath.Join(src, name), filepath.Join(dst, name)
		if ext := filepath.Ext(name); ext == ".sst" || ext == ".blob" {
			if err := os.Link(from, to); err == nil {
				continue
			}
		}
		if err := copyFile(from, to); err != nil {
			return fmt.Errorf("copy engine: %w", err)
		}
	}
	return nil
}

// copyTree copies a stopped engine's directory from src to the new dst,
// subdirectories included, every file copied and none hard-linked: opening
// the copy may change a file in place (appendlog truncates a torn tail of
// its newest file, bbolt writes its meta pages), which a link would share
// with the member's directory. The engine's LOCK and anything other than
// files and directories are left out.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("copy engine: %w", err)
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return fmt.Errorf("copy engine: %w", err)
		}
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			if err := os.Mkdir(to, 0o700); err != nil {
				return fmt.Errorf("copy engine: %w", err)
			}
		case d.Type().IsRegular() && d.Name() != "LOCK":
			if err := copyFile(p, to); err != nil {
				return fmt.Errorf("copy engine: %w", err)
			}
		}
		return nil
	})
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", from, err)
	}
	return out.Close()
}

// offlineTerm reads the term of an entry from a stopped member's raft log
// in dir, read-only.
func offlineTerm(dir string) func(uint64) (uint64, error) {
	return func(index uint64) (uint64, error) {
		_, ents, err := raftlog.ReadEntries(vfs.Default, dir)
		if err != nil {
			return 0, err
		}
		for _, e := range ents {
			if e.GetIndex() == index {
				return e.GetTerm(), nil
			}
		}
		return 0, fmt.Errorf("the log in %s no longer holds entry %d", dir, index)
	}
}
