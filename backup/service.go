package backup

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/datadir"
)

// Options are a running member's backup settings (its --backup-* and
// --s3-* flags).
type Options struct {
	// Target is the URL of the member's own target (--backup-target);
	// empty: none, and the member takes versions only when asked for one
	// of another target (Service.Create).
	Target string
	// TargetOptions reach an s3:// target: the member's --s3-* flags,
	// else its environment. They are used for every target the member
	// writes, its own and those a request names.
	TargetOptions TargetOptions
	// Interval is the time between two versions of the continuous mode
	// (--backup-interval); 0 turns it off.
	Interval time.Duration
	// LogInterval is the time between two archivings of the raft log
	// between versions (--backup-log-interval; docs/backup.md,
	// "Point-in-time restore"); 0: the log is archived only right after each
	// version. It must be short enough that the member's log still holds
	// what was applied since the last archiving (else a gap).
	LogInterval time.Duration
	// Keep prunes the target after each version of the continuous mode
	// (--backup-keep-last, --backup-keep-within, --backup-keep-exponential);
	// zero prunes nothing.
	Keep Retention
	// Policy says when a version is a log version (--backup-log-ratio,
	// --backup-full-every; docs/backup.md, "Log versions"); the zero
	// Policy takes files versions only.
	Policy Policy
}

// ServiceConfig is what a member gives its Service at construction.
type ServiceConfig struct {
	Options
	// Engine, ID, Term and Logger are as in Config.
	Engine Checkpointer
	ID     datadir.ID
	Term   func(index uint64) (uint64, error)
	Logger *zap.Logger
	// StagingDir holds the checkpoints while they upload; it must be on
	// the engine's file system (Config.StagingDir). OpenService creates
	// it and removes what a crash left in it.
	StagingDir string
	// Log and Applied, if Log is not nil, are the member's raft log and
	// applied index: the continuous mode archives the applied entries
	// to the target for point-in-time restore (ArchiveLog).
	Log LogSource
	// Applied reports the member's applied index (apply.Applier).
	Applied interface{ AppliedIndex() uint64 }
	// FS is the member's file system (nil: the operating system's). A
	// Backuper reads checkpoints with the os package, so on any other file
	// system (the power-cut tests' in-memory one) the Service touches no
	// directory and refuses versions (ErrOtherFS).
	FS vfs.FS
	// Raft tells whether this member (MemberID) leads its cluster; the
	// continuous mode takes a version only then (docs/backup.md, "Which
	// member backs up"). Nil: always.
	Raft     interface{ Leader() uint64 }
	MemberID uint64
}

// Service is a running member's backups: the continuous mode (Run) into
// its own target, versions on request into any target (Create, and the
// gRPC method Register serves), and the counters of both (Stats).
//
// Concurrency: every method is safe from any goroutine. Versions of the
// member's own target go through one Backuper (serialised with its
// prunes); versions of any other target are serialised by otherMu, so the
// member is one writer of each target (package comment, "Concurrency").
type Service struct {
	cfg ServiceConfig

	mu sync.Mutex // guards own
	// otherMu serialises the versions of targets other than the member's
	// own, apart from mu, so that a long one never holds up the
	// continuous mode.
	otherMu sync.Mutex
	// own is the Backuper of cfg.Target, nil until the target is first
	// reached: a member starts even if its target cannot be reached, and
	// tries again at each interval. Guarded by mu.
	own *Backuper
	// counters are shared by every Backuper of the Service, so that Stats
	// counts the versions of every target.
	counters *counters

	// closed ends the versions under way when Close is called; inflight
	// counts the Create calls Close waits for. closeMu orders Close after
	// every inflight.Add.
	closed    context.Context
	close     context.CancelFunc
	closeMu   sync.Mutex
	inflight  sync.WaitGroup
	isClosing bool // guarded by closeMu
	// otherFS: the member's file system is not the operating system's;
	// every version is refused (ErrOtherFS).
	otherFS bool
	// samples holds the (applied index, time) samples of the continuous
	// mode until the log objects carrying them are archived; nil without
	// Log and Applied (docs/backup.md, "Point-in-time restore", rule 6).
	samples *Sampler

	// indexMu guards the newest version's raft index VersionIndex last
	// read from the member's own target, and when it read it.
	indexMu   sync.Mutex
	indexRead time.Time
	index     uint64
	// indexRefresh is versionIndexRefresh (a test's is shorter).
	indexRefresh time.Duration
}

// versionIndexRefresh is how long VersionIndex answers from what it last
// read before it lists the target again: a logger's truncation (its only
// caller) need not follow a new version closely, and every member asks
// (one List and one Get of an s3:// target per refresh, not per second).
const versionIndexRefresh = 5 * time.Second

// stagingPrefix begins every directory a Backuper stages a checkpoint in
// (os.MkdirTemp in create).
const stagingPrefix = "strata-backup-"

// OpenService checks cfg (a malformed target URL or interval is an
// error), creates the staging directory and removes the checkpoints a
// crash left in it. It starts nothing and does not reach the target.
func OpenService(cfg ServiceConfig) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Interval < 0 {
		return nil, fmt.Errorf("--backup-interval %s: want 0 (off) or more", cfg.Interval)
	}
	if cfg.Interval > 0 && cfg.Target == "" {
		return nil, errors.New("--backup-interval needs --backup-target")
	}
	if cfg.LogInterval < 0 || cfg.LogInterval > 0 && cfg.Interval == 0 {
		return nil, fmt.Errorf("--backup-log-interval %s: want 0 (off), or more with --backup-interval", cfg.LogInterval)
	}
	if cfg.Target != "" {
		if err := checkTargetURL(cfg.Target); err != nil {
			return nil, fmt.Errorf("--backup-target: %w", err)
		}
	}
	closed, cancel := context.WithCancel(context.Background())
	s := &Service{cfg: cfg, counters: &counters{}, closed: closed, close: cancel, indexRefresh: versionIndexRefresh}
	if cfg.Log != nil && cfg.Applied != nil {
		s.samples = NewSampler(cfg.Applied, nil)
	}
	if cfg.FS != nil && cfg.FS != vfs.Default {
		if cfg.Target != "" {
			cancel()
			return nil, fmt.Errorf("--backup-target: %w", ErrOtherFS)
		}
		s.otherFS = true
		return s, nil
	}
	if cfg.StagingDir == "" {
		return nil, errors.New("backup: no staging directory")
	}
	if err := os.MkdirAll(cfg.StagingDir, 0o700); err != nil {
		return nil, fmt.Errorf("backup: staging directory: %w", err)
	}
	entries, err := os.ReadDir(cfg.StagingDir)
	if err != nil {
		return nil, fmt.Errorf("backup: staging directory: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), stagingPrefix) {
			p := filepath.Join(cfg.StagingDir, e.Name())
			if err := os.RemoveAll(p); err != nil {
				return nil, fmt.Errorf("backup: remove a crashed backup's checkpoint: %w", err)
			}
			cfg.Logger.Info("backup: removed a checkpoint a crash left behind", zap.String("dir", p))
		}
	}
	return s, nil
}

// sameTarget reports whether two target URLs name the same target, so
// that a request naming the member's own target in another spelling
// (a trailing slash, say) goes through the member's own Backuper and never
// writes alongside it.
func sameTarget(a, b string) bool {
	ua, erra := url.Parse(a)
	ub, errb := url.Parse(b)
	if erra != nil || errb != nil {
		return a == b
	}
	clean := func(p string) string { return path.Clean("/" + strings.Trim(p, "/")) }
	return ua.Scheme == ub.Scheme && ua.Host == ub.Host && clean(ua.Path) == clean(ub.Path)
}

// checkTargetURL refuses a URL OpenTarget would refuse without reaching
// anything.
func checkTargetURL(raw string) error {
	if !strings.HasPrefix(raw, "file://") && !strings.HasPrefix(raw, "s3://") {
		return fmt.Errorf("%q: want a file:// or s3:// URL", raw)
	}
	return nil
}

// config is the Backuper configuration of target t; own says it is the
// member's own target, whose log objects carry the time samples (another
// target's do not: the samples an object carries are dropped from memory,
// and the own target's archive must still get them).
func (s *Service) config(t Target, own bool) Config {
	cfg := Config{Engine: s.cfg.Engine, Target: t, ID: s.cfg.ID, Term: s.cfg.Term, StagingDir: s.cfg.StagingDir,
		Logger: s.cfg.Logger, counters: s.counters, Policy: s.cfg.Policy}
	if s.cfg.Log != nil && s.cfg.Applied != nil {
		cfg.Log = s.cfg.Log
		if own {
			cfg.Samples = s.samples
		}
	}
	return cfg
}

// ownBackuper returns the Backuper of the member's own target, opening
// the target the first time it can be reached.
func (s *Service) ownBackuper(ctx context.Context) (*Backuper, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.own != nil {
		return s.own, nil
	}
	if s.cfg.Target == "" {
		return nil, ErrNoTarget
	}
	t, err := openWithin(ctx, s.cfg.Target, s.cfg.TargetOptions)
	if err != nil {
		return nil, err
	}
	s.own = New(s.config(t, true))
	return s.own, nil
}

// openWithin opens a target, giving up after 30 seconds.
func openWithin(ctx context.Context, url string, opts TargetOptions) (Target, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return OpenTarget(ctx, url, opts)
}

// ErrOtherFS: the member runs on a file system other than the operating
// system's, where backups cannot read its checkpoints.
var ErrOtherFS = errors.New("backup: the member's file system is not the operating system's; backups need it")

// ErrNoTarget: a version was asked of the member's own target, and it has
// none (--backup-target).
var ErrNoTarget = errors.New("backup: the member has no --backup-target and the request names none")

// Create takes a version of the engine into the target targetURL (empty:
// the member's own) and returns its manifest. The target is reached with
// the member's TargetOptions. The version is a files or a log version as
// the member's Policy says.
func (s *Service) Create(ctx context.Context, targetURL string) (*Manifest, error) {
	return s.CreateKind(ctx, targetURL, "")
}

// CreateKind is Create with the kind of version asked for, as for
// Backuper.CreateKind ("": as the Policy says).
func (s *Service) CreateKind(ctx context.Context, targetURL string, kind Kind) (*Manifest, error) {
	s.closeMu.Lock()
	if s.isClosing {
		s.closeMu.Unlock()
		return nil, ErrClosed
	}
	s.inflight.Add(1)
	s.closeMu.Unlock()
	defer s.inflight.Done()
	if s.otherFS {
		return nil, ErrOtherFS
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.closed, cancel)()
	if targetURL == "" || sameTarget(targetURL, s.cfg.Target) {
		b, err := s.ownBackuper(ctx)
		if err != nil {
			return nil, err
		}
		return b.CreateKind(ctx, kind)
	}
	if err := checkTargetURL(targetURL); err != nil {
		return nil, fmt.Errorf("backup target: %w", err)
	}
	t, err := openWithin(ctx, targetURL, s.cfg.TargetOptions)
	if err != nil {
		return nil, err
	}
	s.otherMu.Lock()
	defer s.otherMu.Unlock()
	return New(s.config(t, false)).CreateKind(ctx, kind)
}

// ErrClosed: the Service was closed (the member is stopping).
var ErrClosed = errors.New("backup: the member is stopping")

// Close cancels the versions under way (Create calls, the uploads of
// which resume at the next version) and waits for them to return; a
// Create called after Close returns ErrClosed. A member calls it before
// it closes its engine. Run ends with its own context.
func (s *Service) Close() {
	s.closeMu.Lock()
	s.isClosing = true
	s.closeMu.Unlock()
	s.close()
	s.inflight.Wait()
}

// Run is the continuous mode: every Interval, if the member leads its
// cluster, a version of the member's own target, then a prune by Keep.
// It returns when ctx is done; with no Interval or no target it returns at
// once.
func (s *Service) Run(ctx context.Context) {
	if s.cfg.Interval <= 0 || s.cfg.Target == "" {
		return
	}
	s.cfg.Logger.Info("backup: continuous mode", zap.String("target", s.cfg.Target), zap.Duration("interval", s.cfg.Interval),
		zap.Duration("log-interval", s.cfg.LogInterval), zap.Int("keep-last", s.cfg.Keep.KeepLast), zap.Duration("keep-within", s.cfg.Keep.KeepWithin),
		zap.Bool("keep-exponential", s.cfg.Keep.Exponential))
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	if s.samples != nil {
		// Every member samples, leader or not: a member that becomes
		// leader archives with samples of its own from before.
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); s.samples.Run(sctx, SamplePeriod) }()
		defer func() { cancel(); <-done }()
	}
	var logTick <-chan time.Time
	if s.cfg.LogInterval > 0 && s.cfg.Log != nil {
		t := time.NewTicker(s.cfg.LogInterval)
		defer t.Stop()
		logTick = t.C
	}
	for {
		version := false
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			version = true
		case <-logTick:
		}
		if s.cfg.Raft != nil && s.cfg.Raft.Leader() != s.cfg.MemberID {
			continue
		}
		b, err := s.ownBackuper(ctx)
		if err != nil {
			s.counters.failures.Add(1)
			s.cfg.Logger.Warn("backup: target unreachable; next try at the next interval", zap.Error(err))
			continue
		}
		if version {
			b.once(ctx, s.cfg.Keep)
		}
		// After the version: the entries up to now, past its index, so
		// that every revision up to the version's is restorable at once.
		s.archive(ctx, b)
	}
}

// archive archives the member's applied raft log into b's target, if the
// Service has the log.
func (s *Service) archive(ctx context.Context, b *Backuper) {
	if s.cfg.Log == nil || s.cfg.Applied == nil {
		return
	}
	// A sample now, so that the archive reaches the time of this
	// archiving (the sample's index is at most the applied index read
	// next, so this archiving carries it).
	s.samples.Sample()
	rep, err := b.ArchiveLog(ctx, s.cfg.Log, s.cfg.Applied.AppliedIndex(), s.samples)
	switch {
	case err != nil && ctx.Err() == nil:
		s.cfg.Logger.Warn("backup: archiving the raft log failed", zap.Error(err))
	case rep.Entries > 0:
		s.cfg.Logger.Debug("backup: raft log archived", zap.Uint64("first", rep.First), zap.Uint64("last", rep.Last))
	}
}

// VersionIndex returns the raft index of the newest version in the
// member's own target (--backup-target), 0 if it holds none: the entries
// up to it are restorable from the target without a log from elsewhere,
// and a restore from the version replays the entries after it (from a
// logger: docs/logger.md, "Truncation at a backup version"). It reads the
// target at most once per versionIndexRefresh (5 s) and answers from that read
// in between. With no target of its own it returns ErrNoTarget.
func (s *Service) VersionIndex(ctx context.Context) (uint64, error) {
	if s.cfg.Target == "" {
		return 0, ErrNoTarget
	}
	s.indexMu.Lock()
	if !s.indexRead.IsZero() && time.Since(s.indexRead) < s.indexRefresh {
		defer s.indexMu.Unlock()
		return s.index, nil
	}
	s.indexMu.Unlock()
	b, err := s.ownBackuper(ctx)
	if err != nil {
		return 0, err
	}
	last, err := latestVersion(ctx, b.cfg.Target)
	if err != nil {
		return 0, fmt.Errorf("backup target %s: newest version: %w", s.cfg.Target, err)
	}
	var index uint64
	if last > 0 {
		m, err := ReadManifest(ctx, b.cfg.Target, last)
		if err != nil {
			return 0, fmt.Errorf("backup target %s: newest version: %w", s.cfg.Target, err)
		}
		index = m.RaftIndex
	}
	s.indexMu.Lock()
	defer s.indexMu.Unlock()
	s.index, s.indexRead = index, time.Now()
	return index, nil
}

// Stats returns the counters of every version the member took or tried,
// of its own target and of others.
func (s *Service) Stats() Stats { return s.counters.read() }
