package mvcc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// fakeClock fires After channels only when the test advances it.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeWaiter
	added   chan struct{} // one send per After call
}

type fakeWaiter struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Unix(1e9, 0), added: make(chan struct{}, 1000)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, fakeWaiter{at: c.now.Add(d), ch: ch})
	c.mu.Unlock()
	c.added <- struct{}{}
	return ch
}

// advance waits until the goroutine under test is waiting on the clock,
// then moves time by d and fires what is due.
func (c *fakeClock) advance(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-c.added:
	case <-time.After(5 * time.Second):
		t.Fatal("the compactor never waited on the clock")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
			continue
		}
		kept = append(kept, w)
	}
	c.waiters = kept
}

// recorder is the compactor's store and proposer: Rev counts up by one per
// call (as etcd's compactor tests do) and Submit reports each compaction
// request's revision on a channel.
type recorder struct {
	mu   sync.Mutex
	rev  int64
	fail bool
	hang bool // Submit returns only when its context ends (a proposal lost in a leader change)
	reqs chan int64
}

func (r *recorder) Rev() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rev++
	return r.rev
}

func (r *recorder) Submit(ctx context.Context, req *pb.InternalRaftRequest) error {
	r.mu.Lock()
	fail, hang := r.fail, r.hang
	r.mu.Unlock()
	r.reqs <- req.Compaction.Revision
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	if fail {
		return errors.New("injected failure")
	}
	return nil
}

func (r *recorder) next(t *testing.T) int64 {
	t.Helper()
	select {
	case rev := <-r.reqs:
		return rev
	case <-time.After(5 * time.Second):
		t.Fatal("no compaction requested")
		return 0
	}
}

func (r *recorder) none(t *testing.T) {
	t.Helper()
	select {
	case rev := <-r.reqs:
		t.Fatalf("unexpected compaction at %d", rev)
	default:
	}
}

func startAuto(t *testing.T, o AutoCompactOptions) (*AutoCompactor, *fakeClock, *recorder) {
	t.Helper()
	c := newFakeClock()
	r := &recorder{reqs: make(chan int64, 100)}
	o.Clock, o.Store, o.Proposer = c, r, r
	a, err := NewAutoCompactor(o)
	if err != nil {
		t.Fatal(err)
	}
	a.Run()
	t.Cleanup(a.Stop)
	return a, c, r
}

// TestAutoCompactPeriodic follows etcd's TestPeriodicHourly: with a 2h
// period the first compaction comes after 2h at the first recorded
// revision, then one every hour at the revision recorded about a period
// before.
func TestAutoCompactPeriodic(t *testing.T) {
	_, c, r := startAuto(t, AutoCompactOptions{Mode: AutoCompactPeriodic, Period: 2 * time.Hour})
	retry := 6 * time.Minute // 1h cap / 10
	for range 19 {
		c.advance(t, retry)
	}
	// The 20th interval ends at 2h: the wake-up compacts synchronously, so
	// waiting for the next After proves nothing happened before it.
	c.advance(t, retry)
	if got := r.next(t); got != 1 {
		t.Fatalf("first compaction at %d, want 1", got)
	}
	for i := range 3 {
		for range 10 {
			r.none(t)
			c.advance(t, retry)
		}
		if got, want := r.next(t), int64((i+1)*10); got != want {
			t.Fatalf("compaction %d at %d, want %d", i+2, got, want)
		}
	}
}

// TestAutoCompactPeriodicShort: with a 10m period the retry interval is
// 1m, compactions come every 10m, and a failure is retried each minute.
func TestAutoCompactPeriodicShort(t *testing.T) {
	_, c, r := startAuto(t, AutoCompactOptions{Mode: AutoCompactPeriodic, Period: 10 * time.Minute})
	for range 10 {
		r.none(t)
		c.advance(t, time.Minute)
	}
	if got := r.next(t); got != 1 {
		t.Fatalf("first compaction at %d, want 1", got)
	}
	r.mu.Lock()
	r.fail = true
	r.mu.Unlock()
	for range 10 {
		c.advance(t, time.Minute)
	}
	failed := r.next(t)
	c.advance(t, time.Minute) // retried one interval later, at the next oldest record
	if got := r.next(t); got != failed+1 {
		t.Fatalf("retry at %d, want %d", got, failed+1)
	}
}

func TestAutoCompactRevision(t *testing.T) {
	a, c, r := startAuto(t, AutoCompactOptions{Mode: AutoCompactRevision, Retention: 10})
	// Rev() returns 1, 2, ...: rev-10 <= 0 for the first ten looks.
	for range 10 {
		c.advance(t, revisionInterval)
	}
	c.advance(t, revisionInterval)
	if got := r.next(t); got != 1 {
		t.Fatalf("compaction at %d, want 1", got)
	}
	a.Pause()
	c.advance(t, revisionInterval)
	c.advance(t, revisionInterval)
	r.none(t)
	a.Resume()
	c.advance(t, revisionInterval)
	if got := r.next(t); got != 2 {
		t.Fatalf("compaction after resume at %d, want 2", got)
	}
}

// TestAutoCompactProposalTimesOut: a compaction whose proposal is never
// answered (lost in a leader change) gives up after the request timeout
// and is tried again at the next interval, as etcd bounds every proposal;
// it waited forever, and that member never compacted again (found by
// review).
func TestAutoCompactProposalTimesOut(t *testing.T) {
	_, c, r := startAuto(t, AutoCompactOptions{Mode: AutoCompactRevision, Retention: 10, RequestTimeout: 50 * time.Millisecond})
	r.mu.Lock()
	r.hang = true
	r.mu.Unlock()
	for range 11 {
		c.advance(t, revisionInterval)
	}
	if got := r.next(t); got != 1 {
		t.Fatalf("compaction at %d, want 1", got)
	}
	r.mu.Lock()
	r.hang = false
	r.mu.Unlock()
	c.advance(t, revisionInterval) // fails unless the lost proposal gave up
	if got := r.next(t); got <= 1 {
		t.Fatalf("compaction after the lost one at %d, want above 1", got)
	}
}

func TestParseRetention(t *testing.T) {
	tests := []struct {
		mode, in string
		period   time.Duration
		revs     int64
		err      bool
	}{
		{mode: AutoCompactPeriodic, in: "1", period: time.Hour},
		{mode: AutoCompactPeriodic, in: "30m", period: 30 * time.Minute},
		{mode: AutoCompactPeriodic, in: "0", period: 0},
		{mode: AutoCompactPeriodic, in: "x", err: true},
		{mode: AutoCompactRevision, in: "1000", revs: 1000},
		{mode: AutoCompactRevision, in: "1h", err: true},
		{mode: "other", in: "1", err: true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%s", tt.mode, tt.in), func(t *testing.T) {
			p, r, err := ParseRetention(tt.mode, tt.in)
			if (err != nil) != tt.err || p != tt.period || r != tt.revs {
				t.Fatalf("ParseRetention = %v, %d, %v; want %v, %d, err %v", p, r, err, tt.period, tt.revs, tt.err)
			}
		})
	}
}

// TestNewAutoCompaction: etcd's flags turn auto compaction off at a zero
// retention, configure the mode's rule otherwise, and a bad retention is
// an error naming the flag.
func TestNewAutoCompaction(t *testing.T) {
	r := &recorder{reqs: make(chan int64, 1)}
	for _, tt := range []struct {
		mode, retention string
		period          time.Duration
		revisions       int64
		off             bool
		err             string
	}{
		{mode: AutoCompactPeriodic, retention: "0", off: true},
		{mode: AutoCompactRevision, retention: "0", off: true},
		{mode: AutoCompactPeriodic, retention: "1", period: time.Hour},
		{mode: AutoCompactPeriodic, retention: "30m", period: 30 * time.Minute},
		{mode: AutoCompactRevision, retention: "1000", revisions: 1000},
		{mode: AutoCompactRevision, retention: "1h", err: "--auto-compaction-retention"},
	} {
		a, err := NewAutoCompaction(tt.mode, tt.retention, AutoCompactOptions{Store: r, Proposer: r})
		switch {
		case tt.err != "":
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s %q: err %v, want one naming %s", tt.mode, tt.retention, err, tt.err)
			}
		case err != nil:
			t.Errorf("%s %q: %v", tt.mode, tt.retention, err)
		case tt.off != (a == nil):
			t.Errorf("%s %q: compactor %v, want off=%v", tt.mode, tt.retention, a, tt.off)
		case a != nil && (a.opts.Period != tt.period || a.opts.Retention != tt.revisions || a.opts.Mode != tt.mode):
			t.Errorf("%s %q: options %+v", tt.mode, tt.retention, a.opts)
		}
	}
}
