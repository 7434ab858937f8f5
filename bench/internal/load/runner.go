package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Histogram bounds: latencies are recorded in microseconds from 1µs to one
// minute with three significant digits (0.1% resolution).
const (
	histMin     = 1
	histMax     = int64(time.Minute / time.Microsecond)
	histSigFigs = 3
)

// NewHistogram returns an empty latency histogram in microseconds.
func NewHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(histMin, histMax, histSigFigs)
}

// opTimeout bounds one request, so a dead server ends a run with errors
// instead of hanging it.
const opTimeout = 10 * time.Second

// Config is one run of a workload.
type Config struct {
	// Endpoints are the servers' client URLs.
	Endpoints []string
	// Conns is the number of gRPC connections (clientv3 clients).
	Conns int
	// Clients is the number of concurrent request loops, spread evenly over
	// the connections.
	Clients int
	// Total is the number of operations to issue.
	Total int64
	// Serializable makes reads local instead of linearizable.
	Serializable bool
	// Records is passed to Workload.NewGenerator (keys already loaded).
	Records int64
	// Seed makes the key sequence reproducible.
	Seed uint64
	// Progress receives a one-line progress display; nil for none.
	Progress io.Writer
	// Label prefixes the progress line.
	Label string
}

// Result is what a run measured.
type Result struct {
	// Ops counts completed operations, errors included.
	Ops int64
	// Errors counts failed operations; their latencies are not recorded.
	Errors int64
	// FirstError is the first failure, for the log.
	FirstError error
	// Elapsed is wall time from the first request to the last response.
	Elapsed time.Duration
	// Hist holds the latencies of successful operations in microseconds.
	Hist *hdrhistogram.Histogram
}

// Throughput returns successful operations per second.
func (r Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops-r.Errors) / r.Elapsed.Seconds()
}

// Run drives w against cfg.Endpoints and returns the measurements.
func Run(ctx context.Context, w Workload, cfg Config) (Result, error) {
	if cfg.Conns < 1 || cfg.Clients < 1 || cfg.Total < 1 {
		return Result{}, fmt.Errorf("run %s: conns %d, clients %d, total %d must all be >= 1", w.Name(), cfg.Conns, cfg.Clients, cfg.Total)
	}
	clis := make([]*clientv3.Client, 0, cfg.Conns)
	defer func() {
		for _, c := range clis {
			c.Close()
		}
	}()
	for i := 0; i < cfg.Conns; i++ {
		c, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return Result{}, fmt.Errorf("run %s: connect %d: %w", w.Name(), i, err)
		}
		clis = append(clis, c)
	}
	// Warm up: one read per connection, so connection setup is not timed
	// as the latency of the first requests.
	for i, c := range clis {
		wctx, cancel := context.WithTimeout(ctx, opTimeout)
		_, err := c.Get(wctx, "strata-bench-warmup", clientv3.WithSerializable())
		cancel()
		if err != nil {
			return Result{}, fmt.Errorf("run %s: warm up connection %d: %w", w.Name(), i, err)
		}
	}
	gen := w.NewGenerator(cfg.Records)
	prog := StartProgress(cfg.Progress, cfg.Label, cfg.Total)
	defer prog.Stop()

	var (
		issued   atomic.Int64
		errCount atomic.Int64
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
		hists    = make([]*hdrhistogram.Histogram, cfg.Clients)
	)
	start := time.Now()
	for i := 0; i < cfg.Clients; i++ {
		hists[i] = NewHistogram()
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cli := clis[i%len(clis)]
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
			h := hists[i]
			for issued.Add(1) <= cfg.Total {
				if ctx.Err() != nil {
					return
				}
				op := gen.Next(rng)
				t0 := time.Now()
				err := do(ctx, cli, op, cfg.Serializable)
				d := time.Since(t0)
				prog.Add(1)
				if err != nil {
					errCount.Add(1)
					errOnce.Do(func() { firstErr = err })
					continue
				}
				_ = h.RecordValue(max(d.Microseconds(), histMin))
			}
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start)
	res := Result{Ops: min(issued.Load(), cfg.Total), Errors: errCount.Load(), FirstError: firstErr, Elapsed: elapsed, Hist: NewHistogram()}
	for _, h := range hists {
		res.Hist.Merge(h)
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("run %s: %w", w.Name(), err)
	}
	return res, nil
}

// do issues one operation.
func do(ctx context.Context, cli *clientv3.Client, op Op, serializable bool) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	switch op.Kind {
	case OpRead:
		var opts []clientv3.OpOption
		if serializable {
			opts = append(opts, clientv3.WithSerializable())
		}
		_, err := cli.Get(ctx, op.Key, opts...)
		return err
	case OpList:
		resp, err := cli.Get(ctx, op.Key, clientv3.WithPrefix())
		if err == nil && len(resp.Kvs) == 0 {
			err = fmt.Errorf("list %q: no keys", op.Key)
		}
		return err
	case OpListStream:
		return listStream(ctx, cli, op.Key)
	default:
		_, err := cli.Put(ctx, op.Key, string(op.Value))
		return err
	}
}

// listStream reads every key under prefix through RangeStream, chunk by
// chunk, keeping none of them.
func listStream(ctx context.Context, cli *clientv3.Client, prefix string) error {
	stream, err := pb.NewKVClient(cli.ActiveConnection()).RangeStream(ctx, &pb.RangeRequest{
		Key: []byte(prefix), RangeEnd: []byte(clientv3.GetPrefixRangeEnd(prefix)),
	})
	if err != nil {
		return fmt.Errorf("range stream %q: %w", prefix, err)
	}
	keys := 0
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("range stream %q: %w", prefix, err)
		}
		keys += len(resp.GetRangeResponse().GetKvs())
	}
	if keys == 0 {
		return fmt.Errorf("range stream %q: no keys", prefix)
	}
	return nil
}

// LoadList writes ListKey(0..n-1) with valueSize-byte values, in
// transactions of loadBatch puts.
func LoadList(ctx context.Context, endpoints []string, n int64, valueSize int) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("load list keys: connect: %w", err)
	}
	defer cli.Close()
	val := string(value(valueSize, 4))
	for lo := int64(0); lo < n; lo += loadBatch {
		ops := make([]clientv3.Op, 0, loadBatch)
		for i := lo; i < min(lo+loadBatch, n); i++ {
			ops = append(ops, clientv3.OpPut(ListKey(i), val))
		}
		tctx, cancel := context.WithTimeout(ctx, 4*opTimeout)
		_, err := cli.Txn(tctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("load list keys [%d, %d): %w", lo, min(lo+loadBatch, n), err)
		}
	}
	return nil
}

// loadBatch is the number of puts per transaction while preloading; etcd's
// default --max-txn-ops is 128.
const loadBatch = 100

// loadWorkers is the number of concurrent preload transactions.
const loadWorkers = 16

// Load writes records 0..n-1 (YCSBKey names, valueSize-byte values) in
// transactions of loadBatch puts, so a 10^6-key space loads in thousands of
// commits rather than a million.
func Load(ctx context.Context, endpoints []string, n int64, valueSize int, progress io.Writer, label string) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("load: connect: %w", err)
	}
	defer cli.Close()
	val := string(value(valueSize, 2))
	prog := StartProgress(progress, label, n)
	defer prog.Stop()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for w := 0; w < loadWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := next.Add(loadBatch) - loadBatch
				if lo >= n || ctx.Err() != nil {
					return
				}
				hi := min(lo+loadBatch, n)
				ops := make([]clientv3.Op, 0, hi-lo)
				for i := lo; i < hi; i++ {
					ops = append(ops, clientv3.OpPut(YCSBKey(i), val))
				}
				tctx, cancel := context.WithTimeout(ctx, 4*opTimeout)
				_, err := cli.Txn(tctx).Then(ops...).Commit()
				cancel()
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("load keys [%d, %d): %w", lo, hi, err))
					mu.Unlock()
					return
				}
				prog.Add(hi - lo)
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("load: %w", err)
	}
	return errors.Join(errs...)
}

// PreloadRange writes RangeKey with a valueSize-byte value.
func PreloadRange(ctx context.Context, endpoints []string, valueSize int) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("preload range key: connect: %w", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := cli.Put(ctx, RangeKey, string(value(valueSize, 3))); err != nil {
		return fmt.Errorf("preload range key: %w", err)
	}
	return nil
}
