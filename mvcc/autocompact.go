package mvcc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
)

// Auto-compaction modes, as etcd's --auto-compaction-mode.
const (
	AutoCompactPeriodic = "periodic"
	AutoCompactRevision = "revision"
)

// revisionInterval is how often revision-mode auto compaction looks at the
// revision (etcd: every 5 minutes).
const revisionInterval = 5 * time.Minute

// Clock is the time source of an AutoCompactor; tests inject a fake.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Proposer replicates a request through raft and waits until it is
// applied; Submit returns the request's error, if any (propose.Proposer).
type Proposer interface {
	Submit(ctx context.Context, req *pb.InternalRaftRequest) error
}

// AutoCompactOptions configure an AutoCompactor.
type AutoCompactOptions struct {
	// Mode is AutoCompactPeriodic or AutoCompactRevision.
	Mode string
	// Period (periodic mode) keeps at least this much history.
	Period time.Duration
	// Retention (revision mode) keeps this many revisions.
	Retention int64
	// Store is the store whose revisions are compacted (a *Store).
	Store interface{ Rev() int64 }
	// Proposer replicates the compaction request and waits for it to
	// apply. An error that errors.Is ErrCompacted counts as success, as in
	// etcd.
	Proposer Proposer
	// RequestTimeout bounds each compaction's proposal, as etcd bounds
	// every proposal: one lost in a leader change is given up and tried
	// again at the next interval. 0 means DefaultCompactRequestTimeout.
	RequestTimeout time.Duration
	// Clock; nil means the real clock.
	Clock Clock
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
}

// ParseRetention reads etcd's --auto-compaction-retention for mode: in
// revision mode a revision count; in periodic mode a duration ("30m") or a
// bare number of hours ("1"). Zero means auto compaction is off.
func ParseRetention(mode, s string) (period time.Duration, revisions int64, err error) {
	switch mode {
	case AutoCompactRevision:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return 0, 0, fmt.Errorf("auto-compaction-retention %q: want a revision count", s)
		}
		return 0, n, nil
	case AutoCompactPeriodic:
		if d, err := time.ParseDuration(s); err == nil && d >= 0 {
			return d, 0, nil
		}
		h, err := strconv.ParseInt(s, 10, 64)
		if err != nil || h < 0 {
			return 0, 0, fmt.Errorf("auto-compaction-retention %q: want a duration or a number of hours", s)
		}
		return time.Duration(h) * time.Hour, 0, nil
	default:
		return 0, 0, fmt.Errorf("unsupported auto-compaction mode %q", mode)
	}
}

// AutoCompactor proposes revision compactions on etcd's schedule
// (server/etcdserver/api/v3compactor):
//
// Periodic mode with period P: every P/10 (at most 6 minutes, as the
// interval is capped at one hour) it records the current revision, keeping
// the last P/(P/10)+1 records, so the oldest is about P old. Once P has
// passed since start, it compacts at the oldest record; after a success it
// compacts again every min(P, 1h) at the then-oldest record, skipping a
// revision it already compacted; a failure is retried every P/10.
//
// Revision mode with retention R: every 5 minutes it compacts at
// Rev()-R if that is positive and not the revision last compacted.
//
// A member that is not the leader should Pause it (etcd does).
//
// Concurrency: Run starts one goroutine; Stop ends it and waits. Pause and
// Resume are safe from any goroutine.
type AutoCompactor struct {
	opts AutoCompactOptions
	lg   *zap.Logger

	mu     sync.Mutex
	paused bool // guarded by mu

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// NewAutoCompaction is NewAutoCompactor for etcd's flags: mode and
// retention are --auto-compaction-mode and --auto-compaction-retention
// (ParseRetention). It returns nil, and no error, when retention is zero:
// auto compaction is off.
func NewAutoCompaction(mode, retention string, o AutoCompactOptions) (*AutoCompactor, error) {
	period, revisions, err := ParseRetention(mode, retention)
	if err != nil {
		return nil, fmt.Errorf("--auto-compaction-retention: %w", err)
	}
	if period == 0 && revisions == 0 {
		return nil, nil
	}
	o.Mode, o.Period, o.Retention = mode, period, revisions
	return NewAutoCompactor(o)
}

// NewAutoCompactor checks the options; it starts nothing.
func NewAutoCompactor(o AutoCompactOptions) (*AutoCompactor, error) {
	if o.Store == nil || o.Proposer == nil {
		return nil, errors.New("auto compactor: Store and Proposer are required")
	}
	switch o.Mode {
	case AutoCompactPeriodic:
		if o.Period <= 0 {
			return nil, fmt.Errorf("auto compactor: period %v must be positive", o.Period)
		}
	case AutoCompactRevision:
		if o.Retention <= 0 {
			return nil, fmt.Errorf("auto compactor: retention %d must be positive", o.Retention)
		}
	default:
		return nil, fmt.Errorf("auto compactor: unsupported mode %q", o.Mode)
	}
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultCompactRequestTimeout
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	a := &AutoCompactor{opts: o, lg: o.Logger, done: make(chan struct{})}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	return a, nil
}

// Run starts the goroutine.
func (a *AutoCompactor) Run() {
	if a.opts.Mode == AutoCompactPeriodic {
		go a.runPeriodic()
	} else {
		go a.runRevision()
	}
}

// Stop ends the goroutine and waits for it. Call it only after Run.
func (a *AutoCompactor) Stop() {
	a.cancel()
	<-a.done
}

// Pause stops compactions until Resume (the clock keeps running).
func (a *AutoCompactor) Pause() {
	a.mu.Lock()
	a.paused = true
	a.mu.Unlock()
}

// Resume undoes Pause.
func (a *AutoCompactor) Resume() {
	a.mu.Lock()
	a.paused = false
	a.mu.Unlock()
}

func (a *AutoCompactor) isPaused() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.paused
}

// wait returns false when stopped, true after d or when paused.
func (a *AutoCompactor) wait(d time.Duration) (run bool) {
	select {
	case <-a.ctx.Done():
		return false
	case <-a.opts.Clock.After(d):
		return true
	}
}

// DefaultCompactRequestTimeout is etcd's request timeout for its default
// election timeout (5 s plus twice 1 s).
const DefaultCompactRequestTimeout = 7 * time.Second

func (a *AutoCompactor) compact(rev int64) bool {
	ctx, cancel := context.WithTimeout(a.ctx, a.opts.RequestTimeout)
	defer cancel()
	err := a.opts.Proposer.Submit(ctx, &pb.InternalRaftRequest{Compaction: &pb.CompactionRequest{Revision: rev}})
	if err == nil || errors.Is(err, ErrCompacted) {
		a.lg.Info("auto compaction done", zap.String("mode", a.opts.Mode), zap.Int64("revision", rev))
		return true
	}
	a.lg.Warn("auto compaction failed", zap.String("mode", a.opts.Mode), zap.Int64("revision", rev), zap.Error(err))
	return false
}

// periodic is the decision state of periodic mode, kept apart from the
// goroutine so tests can step it.
type periodic struct {
	period       time.Duration
	retry        time.Duration // period/10, with period capped at 1h
	compactEvery time.Duration // min(period, 1h), after the first compaction
	retentions   int
	revs         []int64
	lastRev      int64
	lastSuccess  time.Time
	base         time.Duration // period until the first compaction
}

func newPeriodic(period time.Duration, now time.Time) *periodic {
	itv := min(period, time.Hour)
	p := &periodic{period: period, retry: itv / 10, compactEvery: itv, lastSuccess: now, base: period}
	p.retentions = int(period/p.retry) + 1
	return p
}

// record notes the current revision at the start of each interval.
func (p *periodic) record(rev int64) {
	p.revs = append(p.revs, rev)
	if len(p.revs) > p.retentions {
		p.revs = p.revs[1:] // revs[0] is the revision about one period ago
	}
}

// due returns the revision to compact at now, if any.
func (p *periodic) due(now time.Time) (int64, bool) {
	rev := p.revs[0]
	if now.Sub(p.lastSuccess) < p.base || rev == p.lastRev {
		return 0, false
	}
	p.base = p.compactEvery
	return rev, true
}

func (p *periodic) succeeded(rev int64, now time.Time) {
	p.lastRev, p.lastSuccess = rev, now
}

func (a *AutoCompactor) runPeriodic() {
	defer close(a.done)
	p := newPeriodic(a.opts.Period, a.opts.Clock.Now())
	for {
		p.record(a.opts.Store.Rev())
		if !a.wait(p.retry) {
			return
		}
		if a.isPaused() {
			continue
		}
		rev, ok := p.due(a.opts.Clock.Now())
		if !ok {
			continue
		}
		if a.compact(rev) {
			p.succeeded(rev, a.opts.Clock.Now())
		}
	}
}

func (a *AutoCompactor) runRevision() {
	defer close(a.done)
	prev := int64(0)
	for {
		if !a.wait(revisionInterval) {
			return
		}
		if a.isPaused() {
			continue
		}
		rev := a.opts.Store.Rev() - a.opts.Retention
		if rev <= 0 || rev == prev {
			continue
		}
		if a.compact(rev) {
			prev = rev
		}
	}
}
