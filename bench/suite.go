package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/bench/internal/cluster"
	"github.com/strata-kv/strata/bench/internal/load"
	"github.com/strata-kv/strata/bench/internal/report"
)

// etcdFsyncMetrics count etcd's fsyncs: one per WAL sync, plus bbolt backend
// commits, each of which fdatasyncs at least once (bbolt syncs data pages and
// then the meta page, so this sum is a lower bound).
var etcdFsyncMetrics = []string{
	"etcd_disk_wal_fsync_duration_seconds_count",
	"etcd_disk_backend_commit_duration_seconds_count",
}

// strataFsyncMetrics count strata's fsyncs: its raft log's fdatasyncs,
// exported under etcd's WAL fsync histogram. Pebble's own syncs (flushes,
// compactions: a few per second at most) are not counted, so this is a
// lower bound, like etcdFsyncMetrics.
var strataFsyncMetrics = []string{"etcd_disk_wal_fsync_duration_seconds_count"}

// strataEngineSyncMetric counts strata-wal's engine commits, each of which
// syncs Pebble's WAL (--engine-wal).
const strataEngineSyncMetric = "etcd_disk_backend_commit_duration_seconds_count"

// suite runs the chosen steps on every server and collects the report.
//
// Concurrency: one goroutine. Failures of one server in one step are logged,
// noted in the report and collected; the other servers and steps still run,
// and runSuite returns the joined errors at the end.
type suite struct {
	o        options
	log      *zap.Logger
	specs    []cluster.Spec
	rep      *report.Report
	outDir   string
	workDir  string // this run's parent of all cluster directories
	progress io.Writer
	errs     []error
	nextDir  int
}

// runSuite resolves the servers, runs o.steps and writes the report; it
// returns the report (also on error, with what was measured).
func runSuite(ctx context.Context, o options, command string, log *zap.Logger) (*report.Report, error) {
	for _, st := range o.steps {
		if !slices.Contains(steps, st) {
			return nil, fmt.Errorf("unknown step %q (want %s)", st, strings.Join(steps, ","))
		}
	}
	if o.rounds < 1 {
		return nil, fmt.Errorf("-rounds %d: want at least 1", o.rounds)
	}
	started := time.Now().UTC()
	workDir, err := runDirs(&o.repo, &o.binDir, &o.out, o.workDir, strings.Join(o.steps, "-"), "strata-bench-", started)
	if err != nil {
		return nil, err
	}
	s := &suite{
		o:       o,
		log:     log,
		outDir:  o.out,
		workDir: workDir,
		rep: &report.Report{
			Started: started,
			Command: command,
			Machine: machineInfo(workDir),
		},
	}
	if !o.quiet {
		s.progress = os.Stderr
	}
	if !o.keep {
		defer os.RemoveAll(workDir)
	}
	if tmp, err := onTmpfs(workDir); err != nil {
		s.note("could not tell whether %s is tmpfs: %v", workDir, err)
	} else if tmp {
		s.note("data directories are on tmpfs (%s): fsync is free there, so durability costs are not measured", workDir)
	}
	if err := s.resolveServers(ctx); err != nil {
		return s.rep, err
	}
	log.Info("benchmark run", zap.Strings("steps", o.steps), zap.Strings("servers", o.servers), zap.String("out", o.out), zap.String("work", workDir))
	for _, st := range o.steps {
		if ctx.Err() != nil {
			break
		}
		switch st {
		case "put":
			s.stepPut(ctx)
		case "range":
			s.stepRange(ctx)
		case "list":
			s.stepList(ctx)
		case "ycsb":
			s.stepYCSB(ctx)
		case "sweep":
			s.stepSweep(ctx)
		case "restart":
			s.stepRestart(ctx)
		case "defrag":
			s.stepDefrag(ctx)
		}
	}
	if err := ctx.Err(); err != nil {
		s.errs = append(s.errs, fmt.Errorf("run interrupted: %w", err))
	}
	s.rep.Machine.LoadEnd = loadAvg()
	if err := report.WriteJSON(s.rep, filepath.Join(o.out, "results.json")); err != nil {
		s.errs = append(s.errs, err)
	}
	files, err := report.Render(s.rep, o.out)
	if err != nil {
		s.errs = append(s.errs, err)
	}
	log.Info("wrote results", zap.String("dir", o.out), zap.Int("files", len(files)+1))
	return s.rep, errors.Join(s.errs...)
}

// note records a caveat in the report and the log.
func (s *suite) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.log.Warn(msg)
	s.rep.Notes = append(s.rep.Notes, msg)
}

// fail records a failure of one measurement and lets the run go on.
func (s *suite) fail(err error) {
	s.log.Error("measurement failed", zap.Error(err))
	s.rep.Notes = append(s.rep.Notes, "failed: "+err.Error())
	s.errs = append(s.errs, err)
}

// resolveServers builds or locates the binaries and makes one Spec per
// requested server. A strata that does not build is dropped with a note when
// it was only asked for by default; named explicitly it is an error.
func (s *suite) resolveServers(ctx context.Context) error {
	o := &s.o
	need := map[string]bool{}
	for _, name := range o.servers {
		switch name {
		case "etcd", "strata", "strata-wal":
			need[name] = true
		case "strata-bbolt", "strata-appendlog", "strata-hybridlog":
			need["strata"] = true
		case "strata-base":
			if o.strataBaseBin == "" {
				return errors.New("server strata-base needs -strata-base-bin: a strata binary built from another commit")
			}
		default:
			return fmt.Errorf("unknown server %q (want etcd, strata, strata-wal, strata-bbolt, strata-appendlog, strata-hybridlog, strata-base)", name)
		}
	}
	if need["etcd"] && o.etcdBin == "" {
		s.log.Info("building etcd from the tools module", zap.String("bin", o.binDir))
		bin, err := buildEtcd(ctx, o.repo, o.binDir)
		if err != nil {
			return err
		}
		o.etcdBin = bin
	}
	strataErr := error(nil)
	if (need["strata"] || need["strata-wal"]) && o.strataBin == "" {
		s.log.Info("building strata", zap.String("bin", o.binDir))
		bin, err := buildStrata(ctx, o.repo, o.binDir)
		if err != nil {
			strataErr = fmt.Errorf("%w: %w", errNoStrata, err)
			s.note("strata's figures are missing: %v", err)
		} else {
			o.strataBin = bin
		}
	}
	straceBin := ""
	switch o.fsyncCount {
	case "metrics":
	case "strace":
		bin, err := exec.LookPath("strace")
		if err != nil {
			return fmt.Errorf("-fsync-count strace: %w", err)
		}
		if err := cluster.StraceUsable(ctx, bin); err != nil {
			return fmt.Errorf("-fsync-count strace: %w", err)
		}
		straceBin = bin
		s.note("servers run under strace to count their sync calls: each sync pays one extra ptrace stop, so timings are slightly pessimistic, more so for the server that syncs more")
	default:
		return fmt.Errorf("-fsync-count %q: want metrics or strace", o.fsyncCount)
	}
	rev := gitHead(ctx, o.repo)
	for _, name := range o.servers {
		var spec cluster.Spec
		switch name {
		case "etcd":
			spec = cluster.Spec{Name: name, Kind: cluster.KindEtcd, Binary: o.etcdBin, FsyncMetrics: etcdFsyncMetrics}
		case "strata", "strata-wal", "strata-base", "strata-bbolt", "strata-appendlog", "strata-hybridlog":
			binary := o.strataBin
			if name == "strata-base" {
				binary = o.strataBaseBin
			} else if strataErr != nil {
				continue
			}
			spec = cluster.Spec{Name: name, Kind: cluster.KindStrata, Binary: binary, FsyncMetrics: o.strataFsync}
			if len(spec.FsyncMetrics) == 0 {
				spec.FsyncMetrics = strataFsyncMetrics
			}
			if engine, ok := strings.CutPrefix(name, "strata-"); ok && engine != "wal" && engine != "base" {
				// strata on another engine (docs/engines.md), chosen when
				// each fresh cluster's data directory is created.
				spec.ExtraArgs = []string{"--engine=" + engine}
			}
			if name == "strata-wal" {
				spec.ExtraArgs = []string{"--engine-wal"}
				if len(o.strataFsync) == 0 {
					spec.FsyncMetrics = append(slices.Clone(strataFsyncMetrics), strataEngineSyncMetric)
				}
			}
		}
		if o.pprofSeconds > 0 {
			spec.ExtraArgs = append(spec.ExtraArgs, pprofArgs...)
		}
		spec.Members = o.members
		spec.Strace = straceBin
		version := binaryVersion(ctx, spec.Binary)
		if spec.Kind == cluster.KindStrata && rev != "" && name != "strata-base" {
			version = "strata at commit " + rev + " (" + version + ")"
		}
		s.specs = append(s.specs, spec)
		s.rep.Servers = append(s.rep.Servers, report.ServerInfo{Name: name, Binary: spec.Binary, Version: version})
	}
	if len(s.specs) == 0 {
		return fmt.Errorf("no server to benchmark: %w", strataErr)
	}
	return nil
}

// withCluster starts a fresh cluster of spec, runs fn, and stops it.
func (s *suite) withCluster(ctx context.Context, spec cluster.Spec, label string, fn func(*cluster.Cluster) error) {
	s.nextDir++
	dir := filepath.Join(s.workDir, fmt.Sprintf("%03d-%s-%s", s.nextDir, spec.Name, label))
	c, err := cluster.Start(ctx, spec, dir, s.log)
	if err != nil {
		s.fail(fmt.Errorf("%s %s: %w", spec.Name, label, err))
		return
	}
	for i := range s.rep.Servers {
		if s.rep.Servers[i].Name == spec.Name && s.rep.Servers[i].Command == nil {
			s.rep.Servers[i].Command = c.Args()
		}
	}
	defer func() {
		if err := c.Stop(); err != nil {
			s.fail(fmt.Errorf("%s %s: stop: %w", spec.Name, label, err))
		}
		if !s.o.keep {
			os.RemoveAll(dir)
		}
	}()
	if err := fn(c); err != nil {
		s.fail(fmt.Errorf("%s %s: %w", spec.Name, label, err))
	}
}

// measure runs one workload configuration on c and appends its result.
func (s *suite) measure(ctx context.Context, c *cluster.Cluster, w load.Workload, cfg load.Config, res report.Result) error {
	cfg.Endpoints = c.Endpoints()
	cfg.Seed = s.o.seed
	cfg.Progress = s.progress
	cfg.Label = fmt.Sprintf("%s %s %d/%d", c.Spec().Name, w.Name(), cfg.Conns, cfg.Clients)
	if res.Round > 0 {
		cfg.Label += fmt.Sprintf(" r%d", res.Round)
	}
	if err := c.ResetPeakRSS(); err != nil {
		s.log.Warn("peak RSS covers the whole process life", zap.Error(err))
	}
	before, err := c.Sample()
	if err != nil {
		return err
	}
	load1 := loadAvg1()
	waitProfile := s.startProfile(ctx, c, w, cfg)
	lr, runErr := load.Run(ctx, w, cfg)
	after, err := c.Sample()
	waitProfile()
	if err != nil {
		return errors.Join(runErr, err)
	}
	size, apparent, err := c.DataSize()
	if err != nil {
		return errors.Join(runErr, err)
	}
	res.Server = c.Spec().Name
	res.Load1 = load1
	res.Workload = w.Name()
	res.Phase = "run"
	res.Conns, res.Clients, res.Total = cfg.Conns, cfg.Clients, cfg.Total
	res.Ops, res.Errors = lr.Ops, lr.Errors
	if lr.FirstError != nil {
		res.FirstError = lr.FirstError.Error()
	}
	res.Seconds = lr.Elapsed.Seconds()
	res.Throughput = lr.Throughput()
	if lr.Hist != nil {
		res.Summarize(lr.Hist)
	}
	res.Usage = after.Sub(before, c.FsyncSource())
	res.DataDirBytes, res.DataDirApparentBytes = size, apparent
	s.add(res)
	if runErr != nil {
		return runErr
	}
	if lr.Errors > 0 {
		return fmt.Errorf("%s: %d of %d requests failed, first: %w", w.Name(), lr.Errors, lr.Ops, lr.FirstError)
	}
	return nil
}

// add appends a result and rewrites results.json, so a run cut short keeps
// what it measured.
func (s *suite) add(r report.Result) {
	s.rep.Results = append(s.rep.Results, r)
	s.log.Info("measured", zap.String("server", r.Server), zap.String("workload", r.Workload),
		zap.Int("conns", r.Conns), zap.Int("clients", r.Clients), zap.Int64("records", r.Records),
		zap.Float64("ops/s", r.Throughput), zap.Float64("p99 ms", r.Latency.P99), zap.Float64("restart s", r.RestartSeconds))
	if err := report.WriteJSON(s.rep, filepath.Join(s.outDir, "results.json")); err != nil {
		s.log.Warn("save partial results", zap.Error(err))
	}
}

// stepPut runs etcd's benchmark put at each configuration, on a fresh
// cluster each time so the data directory size is the configuration's own.
//
// With -rounds N each configuration is measured N times per server, the
// servers alternating (roundOrder), each time on a fresh cluster.
func (s *suite) stepPut(ctx context.Context) {
	for _, cc := range s.o.putConfigs {
		for round := range s.o.rounds {
			for _, spec := range s.roundOrder(round) {
				w := load.PutWorkload{KeySize: s.o.keySize, ValueSize: s.o.valSize, KeySpace: s.o.keySpace}
				if w.KeySpace == 0 {
					w.KeySpace = s.o.putTotal
				}
				s.withCluster(ctx, spec, fmt.Sprintf("put-%d-%d%s", cc.conns, cc.clients, s.roundLabel(round)), func(c *cluster.Cluster) error {
					return s.measure(ctx, c, w, load.Config{Conns: cc.conns, Clients: cc.clients, Total: s.o.putTotal}, report.Result{Round: s.roundNumber(round)})
				})
			}
		}
	}
}

// roundOrder returns the servers in round's order (round counted from 0):
// as given in even rounds, reversed in odd ones, so that over an even
// number of rounds every server goes first as often as last.
func (s *suite) roundOrder(round int) []cluster.Spec {
	if round%2 == 0 {
		return s.specs
	}
	r := slices.Clone(s.specs)
	slices.Reverse(r)
	return r
}

// roundNumber is Result.Round of round (counted from 0): 0 in a run of one
// round, so such a run's results and report stay as they were.
func (s *suite) roundNumber(round int) int {
	if s.o.rounds <= 1 {
		return 0
	}
	return round + 1
}

// roundLabel tags a cluster directory with its round in an interleaved run.
func (s *suite) roundLabel(round int) string {
	if s.o.rounds <= 1 {
		return ""
	}
	return fmt.Sprintf("-r%d", round+1)
}

// stepRange runs etcd's benchmark range on one preloaded key, for each
// consistency and configuration, on one cluster per server.
//
// With -rounds N the step runs N times, the servers alternating
// (roundOrder), each round on a fresh cluster per server that runs every
// consistency and configuration.
func (s *suite) stepRange(ctx context.Context) {
	for round := range s.o.rounds {
		for _, spec := range s.roundOrder(round) {
			s.rangeCluster(ctx, spec, round)
		}
	}
}

// rangeCluster is one server's share of the range step in one round.
func (s *suite) rangeCluster(ctx context.Context, spec cluster.Spec, round int) {
	s.withCluster(ctx, spec, "range"+s.roundLabel(round), func(c *cluster.Cluster) error {
		if err := load.PreloadRange(ctx, c.Endpoints(), s.o.valSize); err != nil {
			return err
		}
		var errs []error
		for _, cons := range s.o.consistency {
			if cons != "l" && cons != "s" {
				return fmt.Errorf("consistency %q: want l or s", cons)
			}
			w := load.RangeWorkload{Serializable: cons == "s"}
			for _, cc := range s.o.rangeConfigs {
				cfg := load.Config{Conns: cc.conns, Clients: cc.clients, Total: s.o.rangeTotal, Serializable: w.Serializable}
				errs = append(errs, s.measure(ctx, c, w, cfg, report.Result{Round: s.roundNumber(round)}))
			}
		}
		return errors.Join(errs...)
	})
}

// stepList reads every key of a prefix per request (a Kubernetes LIST): for
// each key count, mode (one Range response, RangeStream) and configuration,
// a fresh cluster per server is loaded with that many keys and measured, so
// that the peak RSS of each measurement is that LIST's alone (a server that
// keeps the heap of an earlier measurement would carry it into the next).
// With -rounds N the servers alternate per round (roundOrder).
func (s *suite) stepList(ctx context.Context) {
	for _, mode := range s.o.listModes {
		if mode != "range" && mode != "stream" {
			s.fail(fmt.Errorf("list mode %q: want range or stream", mode))
			return
		}
	}
	for _, n := range s.o.listKeys {
		for _, mode := range s.o.listModes {
			w := load.ListWorkload{Keys: n, Stream: mode == "stream"}
			for _, cc := range s.o.listConfigs {
				for round := range s.o.rounds {
					for _, spec := range s.roundOrder(round) {
						label := fmt.Sprintf("%s-%d-%d-%d%s", w.Name(), n, cc.conns, cc.clients, s.roundLabel(round))
						s.withCluster(ctx, spec, label, func(c *cluster.Cluster) error {
							if err := load.LoadList(ctx, c.Endpoints(), n, s.o.listValSize); err != nil {
								return err
							}
							cfg := load.Config{Conns: cc.conns, Clients: cc.clients, Total: s.o.listTotal, Records: n}
							return s.measure(ctx, c, w, cfg, report.Result{Records: n, Round: s.roundNumber(round)})
						})
					}
				}
			}
		}
	}
}

// stepYCSB loads each record count once per server and runs every chosen
// workload and distribution on it in order, as YCSB does (D's inserts stay).
//
// With -rounds N each round loads every record count afresh, once per
// server, the servers alternating (roundOrder): every round measures the
// same sequence of workloads on the same freshly loaded key space.
func (s *suite) stepYCSB(ctx context.Context) {
	var ws []load.YCSB
	for _, letter := range s.o.ycsbWorkloads {
		for _, d := range s.o.ycsbDists {
			var dist load.Distribution
			if d != "std" {
				var err error
				if dist, err = load.ParseDistribution(d); err != nil {
					s.fail(err)
					return
				}
			}
			w, err := load.YCSBWorkload(letter, dist, 0, s.o.ycsbValSize)
			if err != nil {
				s.fail(err)
				return
			}
			if !slices.ContainsFunc(ws, func(x load.YCSB) bool { return x.Name() == w.Name() }) {
				ws = append(ws, w)
			}
		}
	}
	for _, n := range s.o.ycsbRecords {
		for round := range s.o.rounds {
			for _, spec := range s.roundOrder(round) {
				s.ycsbCluster(ctx, spec, n, ws, round)
			}
		}
	}
}

// ycsbCluster is one server's share of the YCSB step for n records in one
// round: a fresh cluster, the load, every workload in order.
func (s *suite) ycsbCluster(ctx context.Context, spec cluster.Spec, n int64, ws []load.YCSB, round int) {
	s.withCluster(ctx, spec, fmt.Sprintf("ycsb-%d%s", n, s.roundLabel(round)), func(c *cluster.Cluster) error {
		if err := load.Load(ctx, c.Endpoints(), n, s.o.ycsbValSize, s.progress, fmt.Sprintf("%s load %d%s", spec.Name, n, s.roundLabel(round))); err != nil {
			return err
		}
		var errs []error
		for _, w := range ws {
			w.RecordCount = n
			cfg := load.Config{Conns: s.o.ycsbConfig.conns, Clients: s.o.ycsbConfig.clients, Total: s.o.ycsbOps, Records: n}
			errs = append(errs, s.measure(ctx, c, w, cfg, report.Result{Records: n, Round: s.roundNumber(round)}))
		}
		return errors.Join(errs...)
	})
}

// sweepWorkload is put under its own name, so its points form their own
// throughput/latency curve.
type sweepWorkload struct{ load.PutWorkload }

// Name implements load.Workload.
func (sweepWorkload) Name() string { return "sweep-put" }

// stepSweep runs put at increasing client counts on one cluster per server.
//
// With -rounds N the sweep runs N times, the servers alternating
// (roundOrder), each round on a fresh cluster per server.
func (s *suite) stepSweep(ctx context.Context) {
	for round := range s.o.rounds {
		for _, spec := range s.roundOrder(round) {
			s.sweepCluster(ctx, spec, round)
		}
	}
}

// sweepCluster is one server's sweep in one round.
func (s *suite) sweepCluster(ctx context.Context, spec cluster.Spec, round int) {
	s.withCluster(ctx, spec, "sweep"+s.roundLabel(round), func(c *cluster.Cluster) error {
		var errs []error
		for _, n := range s.o.sweepClients {
			w := sweepWorkload{load.PutWorkload{KeySize: s.o.keySize, ValueSize: s.o.valSize, KeySpace: s.o.sweepTotal}}
			cfg := load.Config{Conns: min(n, 100), Clients: n, Total: s.o.sweepTotal}
			errs = append(errs, s.measure(ctx, c, w, cfg, report.Result{Round: s.roundNumber(round)}))
		}
		return errors.Join(errs...)
	})
}

// stepRestart loads N keys, kills the server with SIGKILL, restarts it and
// times exec until the first linearizable read, then checks the last key.
//
// With -rounds N each key count is measured N times per server, the
// servers alternating (roundOrder), each time on a fresh cluster: a
// restart's time depends on where in the engine's flush cycle the kill
// falls (strata's replays what was applied after the last flush), so one
// restart per server says little (docs/bench/REPORT.md, sixteenth session:
// 0.25-0.83 s for four restarts of one build).
func (s *suite) stepRestart(ctx context.Context) {
	s.forRounds(ctx, "restart", s.o.restartKeys, func(c *cluster.Cluster, n int64, round int) error {
		return s.measureRestart(ctx, c, n, round)
	})
}

// forRounds runs measure for each key count, -rounds times per server, the
// servers alternating (roundOrder), each time on a fresh cluster named after
// the step, the key count and the round; measure gets the round's
// Result.Round (roundNumber).
func (s *suite) forRounds(ctx context.Context, step string, keys []int64, measure func(c *cluster.Cluster, n int64, round int) error) {
	for _, n := range keys {
		for round := range s.o.rounds {
			for _, spec := range s.roundOrder(round) {
				s.withCluster(ctx, spec, fmt.Sprintf("%s-%d%s", step, n, s.roundLabel(round)), func(c *cluster.Cluster) error {
					return measure(c, n, s.roundNumber(round))
				})
			}
		}
	}
}

// measureRestart loads n keys on c, kills it, restarts it and adds the
// result, tagged with round.
func (s *suite) measureRestart(ctx context.Context, c *cluster.Cluster, n int64, round int) error {
	name := c.Spec().Name
	if err := load.Load(ctx, c.Endpoints(), n, s.o.ycsbValSize, s.progress, fmt.Sprintf("%s load %d", name, n)); err != nil {
		return err
	}
	if err := c.Kill(); err != nil {
		return err
	}
	d, err := c.Restart(ctx)
	if err != nil {
		return err
	}
	if err := checkKey(ctx, c, load.YCSBKey(n-1)); err != nil {
		return fmt.Errorf("after restart: %w", err)
	}
	size, apparent, err := c.DataSize()
	if err != nil {
		return err
	}
	s.add(report.Result{
		Server: name, Workload: "restart", Phase: "restart", Records: n, Round: round,
		RestartSeconds: d.Seconds(), DataDirBytes: size, DataDirApparentBytes: apparent, Usage: cluster.Usage{FsyncSource: c.FsyncSource()},
	})
	return nil
}

// checkKey fails unless key exists: an acknowledged write lost across the
// crash would make the restart time meaningless.
func checkKey(ctx context.Context, c *cluster.Cluster, key string) error {
	cli, err := c.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("read %q: %w", key, err)
	}
	if resp.Count != 1 {
		return fmt.Errorf("key %q lost: count %d", key, resp.Count)
	}
	return nil
}
