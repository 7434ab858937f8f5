package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/bench/internal/cluster"
	"github.com/strata-kv/strata/bench/internal/load"
	"github.com/strata-kv/strata/bench/internal/report"
)

// The defrag step: the longest write stall while the server defragments.
//
// etcd's Defragment rewrites its bbolt file while holding the backend's
// locks, so applies (and the writes waiting on them) stop until it is done;
// strata's starts a full engine compaction in the background and returns
// (docs/maintenance.md). For each server and -defrag-keys N:
//
//  1. load N keys (100-byte values, YCSB's keys), then load them again, so
//     half of the revisions are garbage, and compact to the last revision
//     (physically): the state a defragmentation exists for. The data
//     directory's size is taken here ("before").
//  2. -defrag-clients writers put new keys (as etcd's benchmark put) for
//     -defrag-window; after one second, Defragment is called on every member
//     in turn, as `etcdctl defrag --cluster` does. The window is extended,
//     if need be, to one second past the last Defragment's return.
//  3. The result: the longest interval in which no write completed (the
//     stall), the writes' latency, the time the Defragment calls took, and
//     the data directory's size after the window ("after").
//
// strata's Defragment returns before its compaction ends, so its stall is
// whatever that background work costs the writers within the window.

// defragDelay is how long the writers run before Defragment is called, so
// the window shows their pace before it.
const defragDelay = time.Second

// defragTimeout bounds one Defragment call (etcd's takes seconds per GiB).
const defragTimeout = 5 * time.Minute

// stepDefrag runs the defrag measurement for each key count and server.
//
// With -rounds N each key count is measured N times per server, the
// servers alternating (roundOrder), each time on a fresh cluster.
func (s *suite) stepDefrag(ctx context.Context) {
	s.forRounds(ctx, "defrag", s.o.defragKeys, func(c *cluster.Cluster, n int64, round int) error {
		return s.measureDefrag(ctx, c, n, round)
	})
}

// measureDefrag prepares n keys with garbage on c, then measures writes
// during a defragmentation and adds the result, tagged with round.
func (s *suite) measureDefrag(ctx context.Context, c *cluster.Cluster, n int64, round int) error {
	name := c.Spec().Name
	for pass := 1; pass <= 2; pass++ {
		if err := load.Load(ctx, c.Endpoints(), n, s.o.ycsbValSize, s.progress, fmt.Sprintf("%s defrag load %d/2", name, pass)); err != nil {
			return err
		}
	}
	cli, err := c.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	if err := compactAll(ctx, cli); err != nil {
		return err
	}
	before, _, err := c.DataSize()
	if err != nil {
		return err
	}
	if err := c.ResetPeakRSS(); err != nil {
		s.log.Warn("peak RSS covers the whole process life", zap.Error(err))
	}
	s0, err := c.Sample()
	if err != nil {
		return err
	}
	w := defragWriters{
		endpoints: c.Endpoints(),
		clients:   s.o.defragClients,
		keySize:   s.o.keySize,
		valSize:   s.o.valSize,
	}
	dr, err := w.run(ctx, s.o.defragWindow, func() (time.Duration, error) { return defragment(ctx, cli, c.Endpoints()) })
	if err != nil {
		return err
	}
	s1, err := c.Sample()
	if err != nil {
		return err
	}
	after, apparent, err := c.DataSize()
	if err != nil {
		return err
	}
	res := report.Result{
		Server: name, Workload: "defrag", Phase: "defrag", Records: n, Round: round,
		Conns: 1, Clients: s.o.defragClients,
		Ops: dr.ops, Errors: dr.errors, Seconds: dr.elapsed.Seconds(),
		Usage:        s1.Sub(s0, c.FsyncSource()),
		DataDirBytes: after, DataDirApparentBytes: apparent,
		DataDirBytesBefore: before,
		StallSeconds:       dr.stall.Seconds(),
		DefragSeconds:      dr.defrag.Seconds(),
	}
	if dr.elapsed > 0 {
		res.Throughput = float64(dr.ops-dr.errors) / dr.elapsed.Seconds()
	}
	if dr.firstErr != nil {
		res.FirstError = dr.firstErr.Error()
	}
	res.Summarize(dr.hist)
	s.add(res)
	if dr.errors > 0 {
		return fmt.Errorf("defrag: %d of %d writes failed, first: %w", dr.errors, dr.ops, dr.firstErr)
	}
	return nil
}

// compactAll compacts the key space to its current revision and waits for
// the compaction to be physical (etcd's --physical).
func compactAll(ctx context.Context, cli *clientv3.Client) error {
	ctx, cancel := context.WithTimeout(ctx, defragTimeout)
	defer cancel()
	resp, err := cli.Get(ctx, "strata-bench-compact", clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("read revision before compaction: %w", err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("compact to revision %d: %w", resp.Header.Revision, err)
	}
	return nil
}

// defragment calls Defragment on each endpoint in turn and returns the
// total time the calls took.
func defragment(ctx context.Context, cli *clientv3.Client, endpoints []string) (time.Duration, error) {
	start := time.Now()
	for _, ep := range endpoints {
		dctx, cancel := context.WithTimeout(ctx, defragTimeout)
		_, err := cli.Defragment(dctx, ep)
		cancel()
		if err != nil {
			return time.Since(start), fmt.Errorf("defragment %s: %w", ep, err)
		}
	}
	return time.Since(start), nil
}

// defragWriters puts new keys from several goroutines and tracks the
// longest gap between two completed writes.
type defragWriters struct {
	endpoints        []string
	clients          int
	keySize, valSize int
}

// defragResult is what one window measured.
type defragResult struct {
	ops, errors int64
	firstErr    error
	elapsed     time.Duration // the window
	stall       time.Duration // longest interval without a completed write
	defrag      time.Duration // time the Defragment calls took
	hist        *hdrhistogram.Histogram
}

// gapTracker records completion times and keeps the longest gap between
// consecutive ones.
//
// Concurrency: safe for use by the writer goroutines.
type gapTracker struct {
	mu      sync.Mutex
	last    time.Time // guarded by mu
	longest time.Duration
}

// done records a completion at t.
func (g *gapTracker) done(t time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t.After(g.last) {
		g.longest = max(g.longest, t.Sub(g.last))
		g.last = t
	}
}

// run writes for at least window (and until one second after defrag
// returns), calling defrag after defragDelay, and returns the measurement.
func (w defragWriters) run(parent context.Context, window time.Duration, defrag func() (time.Duration, error)) (defragResult, error) {
	cli, err := cluster.NewClient(w.endpoints)
	if err != nil {
		return defragResult{}, err
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var (
		res      defragResult
		ops, bad atomic.Int64
		seq      atomic.Uint64
		errOnce  sync.Once
		histMu   sync.Mutex
		wg       sync.WaitGroup
	)
	hist := load.NewHistogram()
	start := time.Now()
	gaps := &gapTracker{last: start}
	// Incompressible values, as etcd's benchmark writes: zeros would flatter
	// the engine that compresses (Pebble) in the size figures.
	rng := rand.New(rand.NewPCG(1, 2))
	vb := make([]byte, w.valSize)
	for i := range vb {
		vb[i] = byte(rng.Uint32())
	}
	val := string(vb)
	for i := 0; i < max(w.clients, 1); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				// Keys distinct from the YCSB keys loaded before.
				key := fmt.Sprintf("defrag-%0*d", max(w.keySize, 1), seq.Add(1))
				t0 := time.Now()
				octx, ocancel := context.WithTimeout(ctx, defragTimeout)
				_, err := cli.Put(octx, key, val)
				ocancel()
				t1 := time.Now()
				if ctx.Err() != nil && err != nil {
					return // cancelled at the end of the window: not a failure
				}
				ops.Add(1)
				if err != nil {
					bad.Add(1)
					errOnce.Do(func() { res.firstErr = err })
					continue
				}
				gaps.done(t1)
				histMu.Lock()
				_ = hist.RecordValue(max(t1.Sub(t0).Microseconds(), 1))
				histMu.Unlock()
			}
		}()
	}
	var defragErr error
	end := start.Add(window)
	select {
	case <-ctx.Done():
	case <-time.After(defragDelay):
		res.defrag, defragErr = defrag()
		end = later(end, time.Now().Add(time.Second))
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(end)):
	}
	stopped := time.Now()
	cancel()
	wg.Wait()
	res.elapsed = stopped.Sub(start)
	// The time from the last completion to the end of the window is a gap
	// too: a server stalled until the end must not look smooth.
	gaps.done(stopped)
	res.ops, res.errors, res.stall, res.hist = ops.Load(), bad.Load(), gaps.longest, hist
	return res, errors.Join(defragErr, parent.Err())
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
