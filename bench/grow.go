package main

// The data-growth run (issue 15): how each server's writes behave as its
// data grows, one server after the other.
//
//	go run . grow                                         # 20 GiB per server
//	go run . grow -grow-bytes 200MiB -grow-interval 2s    # a short look
//	go run . grow -render results.json                    # re-render results.md and the plots
//
// For each server of -servers, in order: a fresh single member, then
// -grow-clients writers over -grow-conns connections put new keys (YCSB
// key names, records 0, 1, 2, ... so hashed order; random incompressible
// values of -grow-val-size bytes, one put per request) until the data
// directory (du, strata's log directory included) reaches -grow-bytes or
// -grow-keys keys are written, whichever comes first. Every -grow-interval a
// sample records the keys written, the data directory's size, the writes
// and their p50/p99 latency in the interval, the server's RSS and CPU time.
// The size is checked every second (or every interval, if shorter), so the
// run stops within about a second of writes past the target.
//
// Both servers get --quota-backend-bytes above the target (etcd's default
// quota is 2 GiB, strata's flag enforces one too), so neither raises NOSPACE.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// growOptions configures a growth run.
type growOptions struct {
	servers                           []string
	out, repo, binDir, workDir        string
	keep, quiet                       bool
	seed                              uint64
	etcdBin, strataBin, strataBaseBin string
	valSize, clients, conns           int
	bytes, keys, quota                int64
	interval                          time.Duration
	render                            string
}

// defaultGrowOptions are the sizes of a full growth run.
func defaultGrowOptions() growOptions {
	return growOptions{
		servers:  []string{"etcd", "strata"},
		seed:     1,
		valSize:  1024,
		clients:  100,
		conns:    10,
		bytes:    20 << 30,
		interval: 10 * time.Second,
	}
}

func (o *growOptions) register(fs *flag.FlagSet) {
	fs.Func("servers", "comma-separated servers, run one after the other: etcd, strata, strata-wal, strata-bbolt, strata-appendlog, strata-hybridlog, strata-base (default "+strings.Join(o.servers, ",")+")", listSetter(&o.servers))
	fs.StringVar(&o.out, "out", o.out, "output directory (default <repo>/bench/results/<time>-grow)")
	fs.StringVar(&o.repo, "repo", o.repo, "strata repository root (default: found above the working directory)")
	fs.StringVar(&o.binDir, "bin-dir", o.binDir, "where built binaries go (default <repo>/bench/bin)")
	fs.StringVar(&o.workDir, "work-dir", o.workDir, "where server data directories go (default: the system temp dir); needs room for -grow-bytes and more; must not be tmpfs")
	fs.BoolVar(&o.keep, "keep", o.keep, "keep the data directories and server logs after the run")
	fs.BoolVar(&o.quiet, "quiet", o.quiet, "warnings only (no line per sample)")
	fs.Uint64Var(&o.seed, "seed", o.seed, "random seed of the values")
	fs.StringVar(&o.etcdBin, "etcd-bin", o.etcdBin, "use this etcd binary instead of building tools/cmd/etcd")
	fs.StringVar(&o.strataBin, "strata-bin", o.strataBin, "use this strata binary instead of building cmd/strata")
	fs.StringVar(&o.strataBaseBin, "strata-base-bin", o.strataBaseBin, "the strata-base server's binary (strata built from another commit)")
	fs.IntVar(&o.valSize, "grow-val-size", o.valSize, "value bytes (random, incompressible)")
	fs.IntVar(&o.clients, "grow-clients", o.clients, "concurrent writers")
	fs.IntVar(&o.conns, "grow-conns", o.conns, "gRPC connections the writers share")
	fs.Func("grow-bytes", "stop when the data directory (du) reaches this size, e.g. 20GiB, 200MiB (default 20GiB)", bytesSetter(&o.bytes))
	fs.Int64Var(&o.keys, "grow-keys", o.keys, "stop after this many keys, if that comes first (0: no limit)")
	fs.DurationVar(&o.interval, "grow-interval", o.interval, "sampling interval")
	fs.Func("grow-quota", "--quota-backend-bytes for every server (default: twice -grow-bytes, at least 8GiB)", bytesSetter(&o.quota))
	fs.StringVar(&o.render, "render", o.render, "re-render results.md and the plots (next to it) from this grow results.json and exit")
}

func (o growOptions) check() error {
	switch {
	case len(o.servers) == 0:
		return errors.New("-servers is empty")
	case o.valSize < 1 || o.clients < 1 || o.conns < 1:
		return errors.New("-grow-val-size, -grow-clients and -grow-conns must be at least 1")
	case o.bytes < 1 || o.keys < 0:
		return errors.New("-grow-bytes must be positive and -grow-keys at least 0")
	case o.interval < 10*time.Millisecond:
		return errors.New("-grow-interval must be at least 10ms")
	}
	return nil
}

// quotaBytes is the --quota-backend-bytes every server gets: -grow-quota,
// or twice the target, at least the suite's usual 8 GiB.
func (o growOptions) quotaBytes() int64 {
	if o.quota > 0 {
		return o.quota
	}
	return max(cluster.DefaultQuotaBackendBytes, 2*o.bytes)
}

func runGrow(ctx context.Context, sub string, args []string) error {
	o := defaultGrowOptions()
	fs := flag.NewFlagSet(sub, flag.ContinueOnError)
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.render != "" {
		rep, err := report.ReadGrowJSON(o.render)
		if err != nil {
			return err
		}
		files, err := report.RenderGrow(rep, filepath.Dir(o.render))
		for _, f := range files {
			fmt.Println(f)
		}
		return err
	}
	log, err := newLogger(o.quiet)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck // stderr sync errors are harmless
	command := "go run . " + sub
	if len(args) > 0 {
		command += " " + strings.Join(args, " ")
	}
	_, err = runGrowBench(ctx, o, command, log)
	return err
}

// runGrowBench runs every server in turn and writes results.json (after
// every sample), results.md and the plots (after every server) into o.out;
// it returns the report, also on error.
func runGrowBench(ctx context.Context, o growOptions, command string, log *zap.Logger) (*report.GrowReport, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	started := time.Now().UTC()
	work, err := runDirs(&o.repo, &o.binDir, &o.out, o.workDir, "grow", "strata-grow-bench-", started)
	if err != nil {
		return nil, err
	}
	if !o.keep {
		defer os.RemoveAll(work)
	}
	quota := o.quotaBytes()
	rep := &report.GrowReport{
		Started: started,
		Command: command,
		Machine: machineInfo(work),
		Settings: report.GrowSettings{
			KeySize: len(load.YCSBKey(0)), ValueSize: o.valSize, Clients: o.clients, Conns: o.conns,
			TargetBytes: o.bytes, TargetKeys: o.keys, IntervalSeconds: o.interval.Seconds(), QuotaBackendBytes: quota,
		},
	}
	g := &growRun{o: o, log: log, rep: rep, jsonOut: filepath.Join(o.out, "results.json")}
	if tmp, err := onTmpfs(work); err == nil && tmp {
		g.note("data directories are on tmpfs (%s): the data grows in memory and fsync is free", work)
	}
	// The suite resolves server names to binaries and specs the same way
	// for every subcommand.
	so := defaultOptions()
	so.servers, so.repo, so.binDir = o.servers, o.repo, o.binDir
	so.etcdBin, so.strataBin, so.strataBaseBin = o.etcdBin, o.strataBin, o.strataBaseBin
	s := &suite{o: so, log: log, rep: &report.Report{}}
	err = s.resolveServers(ctx)
	for _, n := range s.rep.Notes {
		g.note("%s", n)
	}
	rep.Servers = s.rep.Servers
	if err != nil {
		return rep, g.finish(err)
	}
	log.Info("servers run one after the other, each with --quota-backend-bytes above the target",
		zap.Strings("servers", o.servers), zap.String("quota", humanBytes(quota)), zap.String("target", humanBytes(o.bytes)))
	var errs []error
	for i, spec := range s.specs {
		if ctx.Err() != nil {
			break
		}
		spec.QuotaBackendBytes = quota
		dir := filepath.Join(work, fmt.Sprintf("%02d-%s-grow", i+1, spec.Name))
		run := g.server(ctx, spec, dir)
		if run.Err != "" {
			errs = append(errs, fmt.Errorf("%s: %s", spec.Name, run.Err))
		}
		if !o.keep {
			os.RemoveAll(dir)
		}
		if _, err := report.RenderGrow(rep, o.out); err != nil {
			log.Warn("render partial results", zap.Error(err))
		}
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, fmt.Errorf("run interrupted: %w", err))
	}
	return rep, g.finish(errors.Join(errs...))
}

// growRun is one growth run.
//
// Concurrency: used by the driving goroutine only; the writers share only
// the growWriters state.
type growRun struct {
	o       growOptions
	log     *zap.Logger
	rep     *report.GrowReport
	jsonOut string
}

func (g *growRun) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	g.log.Warn(msg)
	g.rep.Notes = append(g.rep.Notes, msg)
}

// finish records the end, writes the report and returns err joined with
// any write error.
func (g *growRun) finish(err error) error {
	g.rep.Machine.LoadEnd = loadAvg()
	g.rep.Finished = time.Now().UTC()
	werr := report.WriteGrowJSON(g.rep, g.jsonOut)
	files, rerr := report.RenderGrow(g.rep, g.o.out)
	g.log.Info("wrote results", zap.String("dir", g.o.out), zap.Int("files", len(files)+1))
	return errors.Join(err, werr, rerr)
}

// save rewrites results.json, so an interrupted run keeps its samples.
func (g *growRun) save() {
	if err := report.WriteGrowJSON(g.rep, g.jsonOut); err != nil {
		g.log.Warn("save partial results", zap.Error(err))
	}
}

// server runs one server's growth on a fresh member in dir and returns its
// run, also appended to the report.
func (g *growRun) server(ctx context.Context, spec cluster.Spec, dir string) *report.GrowRun {
	g.rep.Runs = append(g.rep.Runs, report.GrowRun{Server: spec.Name})
	run := &g.rep.Runs[len(g.rep.Runs)-1]
	c, err := cluster.Start(ctx, spec, dir, g.log)
	if err != nil {
		run.Err = err.Error()
		g.save()
		return run
	}
	run.Command = c.Args()
	for i := range g.rep.Servers {
		if g.rep.Servers[i].Name == spec.Name && g.rep.Servers[i].Command == nil {
			g.rep.Servers[i].Command = c.Args()
		}
	}
	if err := g.grow(ctx, c, run); err != nil {
		run.Err = err.Error()
	}
	if err := c.Stop(); err != nil {
		run.Err = strings.TrimPrefix(run.Err+"; stop: "+err.Error(), "; ")
	}
	g.save()
	return run
}

// growWriters is the state the writers share with the sampler.
type growWriters struct {
	next     atomic.Int64 // the next record to write
	stop     atomic.Bool
	ok, errs atomic.Int64
	errOnce  sync.Once
	firstErr error

	mu   sync.Mutex
	hist *hdrhistogram.Histogram // this interval's latencies (µs)
}

// take returns the interval's histogram and starts a new one.
func (w *growWriters) take() *hdrhistogram.Histogram {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.hist
	w.hist = load.NewHistogram()
	return h
}

// growOpTimeout bounds one write.
const growOpTimeout = 10 * time.Second

// grow writes into c until the target and samples it; run receives the
// samples and the totals.
func (g *growRun) grow(ctx context.Context, c *cluster.Cluster, run *report.GrowRun) error {
	o := g.o
	initial, _, err := c.DataSize()
	if err != nil {
		return err
	}
	run.InitialDataDirBytes = initial
	clis := make([]*clientv3.Client, 0, o.conns)
	defer func() {
		for _, cli := range clis {
			cli.Close()
		}
	}()
	for i := range o.conns {
		cli, err := c.Client()
		if err != nil {
			return err
		}
		clis = append(clis, cli)
		wctx, cancel := context.WithTimeout(ctx, growOpTimeout)
		_, err = cli.Get(wctx, "strata-bench-warmup", clientv3.WithSerializable())
		cancel()
		if err != nil {
			return fmt.Errorf("warm up connection %d: %w", i, err)
		}
	}
	w := &growWriters{hist: load.NewHistogram()}
	total := load.NewHistogram()
	var wg sync.WaitGroup
	start := time.Now()
	for i := range o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cli := clis[i%len(clis)]
			rng := rand.New(rand.NewPCG(o.seed, uint64(i)))
			val := make([]byte, o.valSize)
			for !w.stop.Load() && ctx.Err() == nil {
				k := w.next.Add(1) - 1
				if o.keys > 0 && k >= o.keys {
					return
				}
				fillRandom(rng, val)
				t0 := time.Now()
				pctx, cancel := context.WithTimeout(ctx, growOpTimeout)
				_, err := cli.Put(pctx, load.YCSBKey(k), string(val))
				cancel()
				d := time.Since(t0)
				if err != nil {
					w.errs.Add(1)
					w.errOnce.Do(func() { w.firstErr = fmt.Errorf("put record %d: %w", k, err) })
					continue
				}
				w.mu.Lock()
				_ = w.hist.RecordValue(max(d.Microseconds(), 1))
				w.mu.Unlock()
				w.ok.Add(1)
			}
		}()
	}
	writersDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(writersDone)
	}()

	check := min(o.interval, time.Second)
	tick := time.NewTicker(check)
	defer tick.Stop()
	last := start
	var lastOK, lastErrs int64
	lastPS, err := c.ProcStats()
	if err != nil {
		w.stop.Store(true)
		<-writersDone
		return err
	}
	lastWaits, err := c.DiskWaits()
	if err != nil {
		w.stop.Store(true)
		<-writersDone
		return err
	}
	// sample appends the interval from last to now.
	sample := func() error {
		now := time.Now()
		h := w.take()
		total.Merge(h)
		size, apparent, err := c.DataSize()
		if err != nil {
			return err
		}
		ps, err := c.ProcStats()
		if err != nil {
			return err
		}
		waits, err := c.DiskWaits()
		if err != nil {
			return err
		}
		waited := waits.Sub(lastWaits)
		ok, errs := w.ok.Load(), w.errs.Load()
		s := report.GrowSample{
			Seconds: now.Sub(start).Seconds(), Keys: ok,
			DataDirBytes: size, DataDirApparentBytes: apparent,
			IntervalSeconds: now.Sub(last).Seconds(), Ops: ok - lastOK, Errors: errs - lastErrs,
			RSSBytes: ps.RSSBytes, CPUSeconds: ps.CPUSeconds - lastPS.CPUSeconds, Load1: loadAvg1(),
			Fsyncs: waited.Fsyncs, SlowFsyncs: waited.SlowFsyncs, FsyncSeconds: waited.FsyncSeconds, WriteStallSeconds: waited.WriteStallSeconds,
		}
		if s.IntervalSeconds > 0 {
			s.Throughput = float64(s.Ops) / s.IntervalSeconds
		}
		if h.TotalCount() > 0 {
			s.P50 = float64(h.ValueAtQuantile(50)) / 1000
			s.P99 = float64(h.ValueAtQuantile(99)) / 1000
			s.Max = float64(h.Max()) / 1000
		}
		run.Samples = append(run.Samples, s)
		last, lastOK, lastErrs, lastPS, lastWaits = now, ok, errs, ps, waits
		g.log.Info("grow", zap.String("server", c.Spec().Name), zap.Float64("t s", s.Seconds), zap.Int64("keys", s.Keys),
			zap.Float64("disk MiB", float64(s.DataDirBytes)/(1<<20)), zap.Float64("writes/s", s.Throughput),
			zap.Float64("p99 ms", s.P99), zap.Float64("RSS MiB", float64(s.RSSBytes)/(1<<20)), zap.Float64("CPU %", s.CPUPercent()))
		g.save()
		return nil
	}
	var loopErr error
loop:
	for {
		select {
		case <-ctx.Done():
			run.Stop = "interrupted"
			break loop
		case <-writersDone:
			run.Stop = "keys"
			break loop
		case <-tick.C:
		}
		size, _, err := c.DataSize()
		if err != nil {
			loopErr = err
			run.Stop = "errors"
			break
		}
		if size >= o.bytes {
			run.Stop = "size"
			break
		}
		if time.Since(last) < o.interval-check/10 {
			continue
		}
		if err := sample(); err != nil {
			loopErr = err
			run.Stop = "errors"
			break
		}
		if s := run.Samples[len(run.Samples)-1]; s.Ops == 0 && s.Errors > 0 {
			loopErr = fmt.Errorf("no write succeeded in %.1fs: %w", s.IntervalSeconds, w.firstErr)
			run.Stop = "errors"
			break
		}
	}
	w.stop.Store(true)
	<-writersDone
	run.Seconds = time.Since(start).Seconds()
	if err := sample(); err != nil {
		loopErr = errors.Join(loopErr, err)
	}
	run.Keys, run.Errors = w.ok.Load(), w.errs.Load()
	if n := len(run.Samples); n > 0 {
		run.DataDirBytes, run.DataDirApparentBytes = run.Samples[n-1].DataDirBytes, run.Samples[n-1].DataDirApparentBytes
	}
	if w.firstErr != nil {
		run.FirstError = w.firstErr.Error()
	}
	var lat report.Result
	lat.Summarize(total)
	run.Latency = lat.Latency
	if loopErr == nil && run.Errors > 0 && run.Stop != "interrupted" {
		loopErr = fmt.Errorf("%d of %d writes failed, first: %w", run.Errors, run.Errors+run.Keys, w.firstErr)
	}
	return loopErr
}

// fillRandom fills b with random bytes from rng.
func fillRandom(rng *rand.Rand, b []byte) {
	for i := 0; i < len(b); i += 8 {
		v := rng.Uint64()
		for j := i; j < min(i+8, len(b)); j++ {
			b[j] = byte(v)
			v >>= 8
		}
	}
}

// bytesSetter parses a size such as 20GiB, 200MiB, 8M or 1048576 into *dst.
func bytesSetter(dst *int64) func(string) error {
	return func(s string) error {
		v, err := parseBytes(s)
		if err != nil {
			return err
		}
		*dst = v
		return nil
	}
}

// parseBytes parses a byte count with an optional binary unit: B, K/KiB,
// M/MiB, G/GiB, T/TiB (case-insensitive; KB, MB, GB, TB are taken as the
// binary units too). The number may have a fraction: 1.5GiB.
func parseBytes(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{
		{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
		{"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30}, {"tb", 1 << 40},
		{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40}, {"b", 1},
	} {
		if rest, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("size %q: want a number with an optional unit (B, KiB, MiB, GiB, TiB)", s)
	}
	return int64(f * float64(mult)), nil
}

// humanBytes formats n in MiB below 1 GiB, else in GiB.
func humanBytes(n int64) string {
	if n < 1<<30 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}
