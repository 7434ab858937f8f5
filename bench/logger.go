package main

// Seed 003's first experiment (its Figure 2) on strata: a three-member
// cluster with no logger, with one and with two `strata logger`s attached
// (003 deploys k+1 = 2), under the same put load; throughput and latency
// of the cluster, and beside them each logger's logging rate and lag. The
// loggers are real `strata logger` processes, added the operator's way
// (MemberAddAsLearner, `strata logger join`); nothing of strata is
// imported: the loggers are read through their /metrics.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/bench/internal/cluster"
	"github.com/strata-kv/strata/bench/internal/load"
	"github.com/strata-kv/strata/bench/internal/report"
)

// lgOptions configures the logger experiment.
type lgOptions struct {
	loggers   []int
	configs   []connClients
	total     int64
	valueSize int
	reps      int
	out       string
	repo      string
	binDir    string
	workDir   string
	strataBin string
	seed      uint64
	quiet     bool
	render    string
	// shared, if not empty, runs the shared-logger experiment instead: one
	// logger joined to each of n clusters of three, for each n.
	shared []int
	// costSeconds, if not 0, runs the disk-usage measurement instead: a
	// cluster of three and one logger under load for that long.
	costSeconds int
}

func defaultLGOptions() lgOptions {
	return lgOptions{loggers: []int{0, 1, 2}, configs: []connClients{{1, 1}, {10, 10}, {50, 50}},
		total: 3000, valueSize: 1024, reps: 2, seed: 1}
}

func (o *lgOptions) register(fs *flag.FlagSet) {
	fs.Func("loggers", "comma-separated logger counts attached to the cluster (default 0,1,2)", func(s string) error {
		o.loggers = nil
		for _, x := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(x))
			if err != nil || n < 0 || n > 2 {
				return fmt.Errorf("-loggers %q: want counts 0 to 2", s)
			}
			o.loggers = append(o.loggers, n)
		}
		return nil
	})
	fs.Func("configs", "comma-separated CONNS/CLIENTS of the put load (default 1/1,10/10,50/50)", func(s string) error {
		cc, err := parseConnClients(s)
		o.configs = cc
		return err
	})
	fs.Int64Var(&o.total, "total", o.total, "puts per run")
	fs.IntVar(&o.valueSize, "value-size", o.valueSize, "value bytes (003 uses 1,024)")
	fs.IntVar(&o.reps, "reps", o.reps, "repetitions of every configuration, interleaved")
	fs.StringVar(&o.out, "out", "", "output directory (default bench/results/<time>-logger)")
	fs.StringVar(&o.repo, "repo", "", "strata repository (default: found from the working directory)")
	fs.StringVar(&o.binDir, "bin-dir", "", "where binaries are built (default bench/bin)")
	fs.StringVar(&o.workDir, "work-dir", "", "parent of the temporary data directories (default the system temp dir)")
	fs.StringVar(&o.strataBin, "strata-bin", "", "use this strata binary instead of building one")
	fs.Uint64Var(&o.seed, "seed", o.seed, "load generator seed")
	fs.BoolVar(&o.quiet, "quiet", false, "log warnings only")
	fs.StringVar(&o.render, "render", "", "re-render logger.md beside this logger.json, and run nothing")
	fs.IntVar(&o.costSeconds, "cost-seconds", 0, "run 003's disk-usage measurement instead (its Equations 1-2): a cluster of three and one logger under the first -configs load for this many seconds; disk growth per minute of members' engines and logs and of the logger's log")
	fs.Func("shared", "comma-separated cluster counts: run 003's Figures 3-4 instead (one logger shared by n clusters of three, loaded at once)", func(s string) error {
		o.shared = nil
		for _, x := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(x))
			if err != nil || n < 1 || n > 8 {
				return fmt.Errorf("-shared %q: want counts 1 to 8", s)
			}
			o.shared = append(o.shared, n)
		}
		return nil
	})
}

// lgResult is one run: a cluster of three with Loggers loggers under one
// put configuration.
type lgResult struct {
	Loggers    int     `json:"loggers"`
	Conns      int     `json:"conns"`
	Clients    int     `json:"clients"`
	Rep        int     `json:"rep"`
	Ops        int64   `json:"ops"`
	Errors     int64   `json:"errors"`
	Throughput float64 `json:"throughput_ops_per_s"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	ElapsedS   float64 `json:"elapsed_s"`
	// Per logger: entries it logged during the load, per second of the
	// load; its lag (leader commit - last index held) when the load ended;
	// how long it then took to hold the cluster's commit index.
	LoggerRate     []float64 `json:"logger_entries_per_s,omitempty"`
	LoggerLagAtEnd []float64 `json:"logger_lag_at_end,omitempty"`
	CatchUpMs      []float64 `json:"logger_catch_up_ms,omitempty"`
	Err            string    `json:"error,omitempty"`
}

// lgShared is one run of the shared-logger experiment: one logger joined
// to Clusters clusters of three, every cluster loaded at once.
type lgShared struct {
	Clusters int `json:"clusters"`
	Conns    int `json:"conns"`
	Clients  int `json:"clients"`
	Rep      int `json:"rep"`
	// Per cluster: put/s, p99; cumulative: their sum (003's Figure 3).
	Throughput []float64 `json:"throughput_ops_per_s"`
	P99Ms      []float64 `json:"p99_ms"`
	Cumulative float64   `json:"cumulative_ops_per_s"`
	Errors     int64     `json:"errors"`
	// The logger: entries logged per second, all clusters together
	// (003's Figure 4); the highest lag over the clusters when their load
	// ended; how long until it held every cluster's commit index.
	LoggerRate float64 `json:"logger_entries_per_s"`
	MaxLagEnd  float64 `json:"logger_max_lag_at_end"`
	CatchUpMs  float64 `json:"logger_catch_up_ms"`
	Err        string  `json:"error,omitempty"`
}

// lgCost is the disk-usage measurement: how fast each part's disk usage
// grows under a steady put load (003's d_a and d_l, per minute).
type lgCost struct {
	Seconds    float64 `json:"seconds"`
	Conns      int     `json:"conns"`
	Clients    int     `json:"clients"`
	Ops        int64   `json:"ops"`
	Errors     int64   `json:"errors"`
	Throughput float64 `json:"throughput_ops_per_s"`
	// Per minute of load, in MB (10^6 bytes): the engine's size on disk
	// (etcd_mvcc_db_total_size_in_bytes) and the raft log's live bytes
	// (strata_raftlog_bytes), averaged over the three members; the
	// logger's log bytes (strata_logger_log_bytes).
	MemberEngineMBPerMin float64 `json:"member_engine_mb_per_min"`
	MemberLogMBPerMin    float64 `json:"member_log_mb_per_min"`
	LoggerLogMBPerMin    float64 `json:"logger_log_mb_per_min"`
	Err                  string  `json:"error,omitempty"`
}

// lgReport is the experiment's output (logger.json).
type lgReport struct {
	Started   time.Time      `json:"started"`
	Command   string         `json:"command"`
	Machine   report.Machine `json:"machine"`
	Strata    string         `json:"strata"`
	Commit    string         `json:"commit"`
	Total     int64          `json:"total"`
	ValueSize int            `json:"value_size"`
	Results   []lgResult     `json:"results,omitempty"`
	Shared    []lgShared     `json:"shared,omitempty"`
	Cost      *lgCost        `json:"cost,omitempty"`
}

func runLoggerBench(ctx context.Context, sub string, args []string) error {
	o := defaultLGOptions()
	fs := flag.NewFlagSet(sub, flag.ContinueOnError)
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.render != "" {
		raw, err := os.ReadFile(o.render)
		if err != nil {
			return err
		}
		var rep lgReport
		if err := json.Unmarshal(raw, &rep); err != nil {
			return fmt.Errorf("%s: %w", o.render, err)
		}
		return writeLGReport(&rep, filepath.Dir(o.render))
	}
	if o.total < 1 || o.reps < 1 || len(o.configs) == 0 || len(o.loggers) == 0 {
		return errors.New("-total and -reps must be at least 1, -configs and -loggers not empty")
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
	_, err = runLG(ctx, o, command, log)
	return err
}

// runLG runs every configuration of o, interleaved by repetition, and
// writes logger.json and logger.md into o.out after each run; it returns
// the report (also on error).
func runLG(ctx context.Context, o lgOptions, command string, log *zap.Logger) (*lgReport, error) {
	started := time.Now().UTC()
	workDir, err := runDirs(&o.repo, &o.binDir, &o.out, o.workDir, "logger", "strata-logger-bench-", started)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(workDir)
	bin := o.strataBin
	if bin == "" {
		if bin, err = buildStrata(ctx, o.repo, o.binDir); err != nil {
			return nil, err
		}
	}
	rep := &lgReport{Started: started, Command: command, Machine: machineInfo(workDir), Strata: binaryVersion(ctx, bin),
		Commit: gitHead(ctx, o.repo), Total: o.total, ValueSize: o.valueSize}
	n := 0
	if o.costSeconds > 0 {
		res := costRun(ctx, o, bin, filepath.Join(workDir, "cost"), log)
		rep.Cost = &res
		rep.Machine.LoadEnd = machineInfo(workDir).LoadStart
		return rep, writeLGReport(rep, o.out)
	}
	if len(o.shared) > 0 {
		for r := 1; r <= o.reps; r++ {
			for _, cc := range o.configs {
				for _, k := range o.shared {
					n++
					dir := filepath.Join(workDir, fmt.Sprintf("run-%d", n))
					res := sharedRun(ctx, o, bin, dir, k, cc, log)
					res.Rep = r
					if res.Err != "" {
						log.Warn("run failed", zap.Int("clusters", k), zap.String("error", res.Err))
					} else {
						log.Info("run", zap.Int("clusters", k), zap.Int("clients", cc.clients), zap.Float64("cumulative ops/s", res.Cumulative),
							zap.Float64("logger entries/s", res.LoggerRate))
					}
					rep.Shared = append(rep.Shared, res)
					_ = os.RemoveAll(dir)
					if err := writeLGReport(rep, o.out); err != nil {
						return rep, err
					}
					if ctx.Err() != nil {
						return rep, ctx.Err()
					}
				}
			}
		}
		rep.Machine.LoadEnd = machineInfo(workDir).LoadStart
		return rep, writeLGReport(rep, o.out)
	}
	for r := 1; r <= o.reps; r++ {
		for _, cc := range o.configs {
			for _, k := range o.loggers {
				n++
				dir := filepath.Join(workDir, fmt.Sprintf("run-%d", n))
				res := loggerRun(ctx, o, bin, dir, k, cc, log)
				res.Rep = r
				if res.Err != "" {
					log.Warn("run failed", zap.Int("loggers", k), zap.String("error", res.Err))
				} else {
					log.Info("run", zap.Int("loggers", k), zap.Int("clients", cc.clients), zap.Float64("ops/s", res.Throughput),
						zap.Float64("p50 ms", res.P50Ms), zap.Float64("p99 ms", res.P99Ms))
				}
				rep.Results = append(rep.Results, res)
				_ = os.RemoveAll(dir)
				if err := writeLGReport(rep, o.out); err != nil {
					return rep, err
				}
				if ctx.Err() != nil {
					return rep, ctx.Err()
				}
			}
		}
	}
	rep.Machine.LoadEnd = machineInfo(workDir).LoadStart
	return rep, writeLGReport(rep, o.out)
}

// loggerRun runs one configuration on a fresh cluster of three.
func loggerRun(ctx context.Context, o lgOptions, bin, dir string, loggers int, cc connClients, log *zap.Logger) (res lgResult) {
	res = lgResult{Loggers: loggers, Conns: cc.conns, Clients: cc.clients}
	fail := func(err error) lgResult { res.Err = err.Error(); return res }
	c, err := cluster.Start(ctx, cluster.Spec{Name: "strata", Kind: cluster.KindStrata, Binary: bin, Members: 3}, filepath.Join(dir, "cluster"), log)
	if err != nil {
		return fail(err)
	}
	defer c.Stop() //nolint:errcheck // the run is over; a stop error is logged by Stop
	var lps []*benchLogger
	defer func() {
		for _, lp := range lps {
			lp.stop()
		}
	}()
	var cid uint64
	for i := 0; i < loggers; i++ {
		lp, id, err := attachLogger(ctx, bin, filepath.Join(dir, fmt.Sprintf("logger%d", i+1)), fmt.Sprintf("L%d", i+1), c.Endpoints())
		if lp != nil {
			lps = append(lps, lp)
		}
		if err != nil {
			return fail(err)
		}
		cid = id
	}
	before := make([]float64, len(lps))
	for i, lp := range lps {
		before[i], _ = lp.metric("strata_logger_entries_logged_total", cid)
	}
	r, err := load.Run(ctx, load.PutWorkload{KeySize: 8, ValueSize: o.valueSize, KeySpace: o.total},
		load.Config{Endpoints: c.Endpoints(), Conns: cc.conns, Clients: cc.clients, Total: o.total, Seed: o.seed})
	if err != nil {
		return fail(err)
	}
	res.Ops, res.Errors, res.Throughput, res.ElapsedS = r.Ops, r.Errors, r.Throughput(), r.Elapsed.Seconds()
	res.P50Ms = float64(r.Hist.ValueAtQuantile(50)) / 1000
	res.P99Ms = float64(r.Hist.ValueAtQuantile(99)) / 1000
	for i, lp := range lps {
		lag, _ := lp.metric("strata_logger_lag_entries", cid)
		after, _ := lp.metric("strata_logger_entries_logged_total", cid)
		res.LoggerLagAtEnd = append(res.LoggerLagAtEnd, lag)
		res.LoggerRate = append(res.LoggerRate, (after-before[i])/r.Elapsed.Seconds())
	}
	// How long each logger takes to hold the cluster's commit index.
	commit, err := clusterCommit(ctx, c.Endpoints())
	if err != nil {
		return fail(err)
	}
	t0 := time.Now()
	for _, lp := range lps {
		deadline := time.Now().Add(60 * time.Second)
		for {
			ci, err := lp.metric("strata_logger_commit_index", cid)
			if err == nil && ci >= float64(commit) {
				break
			}
			if time.Now().After(deadline) {
				return fail(fmt.Errorf("logger %s did not reach commit index %d in 60 s", lp.name, commit))
			}
			time.Sleep(5 * time.Millisecond)
		}
		res.CatchUpMs = append(res.CatchUpMs, float64(time.Since(t0).Microseconds())/1000)
	}
	return res
}

// sharedRun starts k clusters of three and one logger joined to all of
// them, loads every cluster at once with cc, and measures.
func sharedRun(ctx context.Context, o lgOptions, bin, dir string, k int, cc connClients, log *zap.Logger) (res lgShared) {
	res = lgShared{Clusters: k, Conns: cc.conns, Clients: cc.clients}
	fail := func(err error) lgShared { res.Err = err.Error(); return res }
	var cs []*cluster.Cluster
	defer func() {
		for _, c := range cs {
			c.Stop() //nolint:errcheck // the run is over; a stop error is logged by Stop
		}
	}()
	for i := 0; i < k; i++ {
		c, err := cluster.Start(ctx, cluster.Spec{Name: "strata", Kind: cluster.KindStrata, Binary: bin, Members: 3},
			filepath.Join(dir, fmt.Sprintf("cluster%d", i+1)), log)
		if err != nil {
			return fail(err)
		}
		cs = append(cs, c)
	}
	lp, err := newBenchLogger(bin, filepath.Join(dir, "logger"), "L1")
	if err != nil {
		return fail(err)
	}
	defer lp.stop()
	cids := make([]uint64, k)
	for i, c := range cs {
		if cids[i], err = lp.join(ctx, c.Endpoints()); err != nil {
			return fail(err)
		}
	}
	if err := lp.start(); err != nil {
		return fail(err)
	}
	for _, c := range cs {
		if err := lp.waitPublished(ctx, c.Endpoints()); err != nil {
			return fail(err)
		}
	}
	before := make([]float64, k)
	for i := range cs {
		before[i], _ = lp.metric("strata_logger_entries_logged_total", cids[i])
	}
	results := make([]load.Result, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = load.Run(ctx, load.PutWorkload{KeySize: 8, ValueSize: o.valueSize, KeySpace: o.total},
				load.Config{Endpoints: c.Endpoints(), Conns: cc.conns, Clients: cc.clients, Total: o.total, Seed: o.seed + uint64(i)})
		}()
	}
	wg.Wait()
	for i := range cs {
		if errs[i] != nil {
			return fail(errs[i])
		}
		r := results[i]
		res.Throughput = append(res.Throughput, r.Throughput())
		res.P99Ms = append(res.P99Ms, float64(r.Hist.ValueAtQuantile(99))/1000)
		res.Cumulative += r.Throughput()
		res.Errors += r.Errors
		lag, _ := lp.metric("strata_logger_lag_entries", cids[i])
		after, _ := lp.metric("strata_logger_entries_logged_total", cids[i])
		res.MaxLagEnd = max(res.MaxLagEnd, lag)
		res.LoggerRate += (after - before[i]) / r.Elapsed.Seconds()
	}
	t0 := time.Now()
	for i, c := range cs {
		commit, err := clusterCommit(ctx, c.Endpoints())
		if err != nil {
			return fail(err)
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			ci, err := lp.metric("strata_logger_commit_index", cids[i])
			if err == nil && ci >= float64(commit) {
				break
			}
			if time.Now().After(deadline) {
				return fail(fmt.Errorf("the logger did not reach cluster %x's commit index %d in 60 s", cids[i], commit))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	res.CatchUpMs = float64(time.Since(t0).Microseconds()) / 1000
	return res
}

// costRun loads a cluster of three with one logger for o.costSeconds and
// measures how fast the members' engines and logs and the logger's log
// grow.
func costRun(ctx context.Context, o lgOptions, bin, dir string, log *zap.Logger) (res lgCost) {
	cc := o.configs[0]
	res = lgCost{Conns: cc.conns, Clients: cc.clients}
	fail := func(err error) lgCost { res.Err = err.Error(); return res }
	c, err := cluster.Start(ctx, cluster.Spec{Name: "strata", Kind: cluster.KindStrata, Binary: bin, Members: 3}, filepath.Join(dir, "cluster"), log)
	if err != nil {
		return fail(err)
	}
	defer c.Stop() //nolint:errcheck // the run is over; a stop error is logged by Stop
	lp, cid, err := attachLogger(ctx, bin, filepath.Join(dir, "logger1"), "L1", c.Endpoints())
	if lp != nil {
		defer lp.stop()
	}
	if err != nil {
		return fail(err)
	}
	sizes := func() (engine, rlog, llog float64, err error) {
		for _, ep := range c.Endpoints() {
			e, err := scrapeGauge(ep+"/metrics", "etcd_mvcc_db_total_size_in_bytes")
			if err != nil {
				return 0, 0, 0, err
			}
			r, err := scrapeGauge(ep+"/metrics", "strata_raftlog_bytes")
			if err != nil {
				return 0, 0, 0, err
			}
			engine, rlog = engine+e/3, rlog+r/3
		}
		llog, err = lp.metric("strata_logger_log_bytes", cid)
		return engine, rlog, llog, err
	}
	e0, r0, l0, err := sizes()
	if err != nil {
		return fail(err)
	}
	lctx, cancel := context.WithTimeout(ctx, time.Duration(o.costSeconds)*time.Second)
	r, err := load.Run(lctx, load.PutWorkload{KeySize: 8, ValueSize: o.valueSize, KeySpace: 1 << 40},
		load.Config{Endpoints: c.Endpoints(), Conns: cc.conns, Clients: cc.clients, Total: 1 << 40, Seed: o.seed})
	cancel()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fail(err)
	}
	e1, r1, l1, err := sizes()
	if err != nil {
		return fail(err)
	}
	res.Seconds, res.Ops, res.Errors, res.Throughput = r.Elapsed.Seconds(), r.Ops, r.Errors, r.Throughput()
	perMin := func(d float64) float64 { return d / 1e6 / r.Elapsed.Minutes() }
	res.MemberEngineMBPerMin, res.MemberLogMBPerMin, res.LoggerLogMBPerMin = perMin(e1-e0), perMin(r1-r0), perMin(l1-l0)
	return res
}

// scrapeGauge reads one unlabelled sample from a /metrics URL.
func scrapeGauge(url, name string) (float64, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, name+" ") {
			return strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, name)), 64)
		}
	}
	return 0, fmt.Errorf("no %s in %s", name, url)
}

// clusterCommit is the highest commit index (etcd's Status RaftIndex) the
// members report.
func clusterCommit(ctx context.Context, endpoints []string) (uint64, error) {
	cli, err := cluster.NewClient(endpoints)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	var highest uint64
	for _, ep := range endpoints {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := cli.Status(sctx, ep)
		cancel()
		if err == nil && st.RaftIndex > highest {
			highest = st.RaftIndex
		}
	}
	if highest == 0 {
		return 0, errors.New("no member answered Status")
	}
	return highest, nil
}

// benchLogger is one `strata logger` process, tracked by PID.
type benchLogger struct {
	name, bin, dir, logDir, peerURL, clientURL string
	cmd                                        *exec.Cmd
	done                                       chan struct{}
}

// newBenchLogger prepares a logger in dir: ports, directories; nothing runs.
func newBenchLogger(bin, dir, name string) (*benchLogger, error) {
	ports, err := twoFreePorts()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	return &benchLogger{name: name, bin: bin, dir: filepath.Join(dir, "data"), logDir: dir,
		peerURL: fmt.Sprintf("http://127.0.0.1:%d", ports[0]), clientURL: fmt.Sprintf("http://127.0.0.1:%d", ports[1])}, nil
}

// join adds the logger to the cluster at endpoints as a learner and records
// the cluster in its data directory (`strata logger join`; a running logger
// serves it within a second). It returns the cluster ID.
func (lp *benchLogger) join(ctx context.Context, endpoints []string) (uint64, error) {
	cli, err := cluster.NewClient(endpoints)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	var cid uint64
	deadline := time.Now().Add(30 * time.Second)
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := cli.MemberAddAsLearner(actx, []string{lp.peerURL})
		cancel()
		if err == nil {
			cid = resp.Header.ClusterId
			break
		}
		// etcd's strict reconfiguration check refuses a change until the
		// member was connected to a quorum for 5 s.
		if !strings.Contains(err.Error(), "unhealthy cluster") || time.Now().After(deadline) {
			return 0, fmt.Errorf("member add --learner %s: %w", lp.name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	out, err := exec.CommandContext(jctx, lp.bin, "logger", "join", "--data-dir="+lp.dir, "--name="+lp.name,
		"--advertise-peer-urls="+lp.peerURL, "--endpoints="+strings.Join(endpoints, ",")).CombinedOutput()
	cancel()
	if err != nil {
		return 0, fmt.Errorf("strata logger join %s: %w: %s", lp.name, err, out)
	}
	return cid, nil
}

// start runs the logger process.
func (lp *benchLogger) start() error {
	logf, err := os.Create(filepath.Join(lp.logDir, "logger.log"))
	if err != nil {
		return err
	}
	lp.cmd = exec.Command(lp.bin, "logger", "--data-dir="+lp.dir, "--listen-peer-urls="+lp.peerURL,
		"--advertise-peer-urls="+lp.peerURL, "--listen-client-urls="+lp.clientURL, "--log-level=warn")
	lp.cmd.Stdout, lp.cmd.Stderr = logf, logf
	lp.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := lp.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start logger %s: %w", lp.name, err)
	}
	lp.done = make(chan struct{})
	go func() { _ = lp.cmd.Wait(); logf.Close(); close(lp.done) }()
	return nil
}

// waitPublished waits until the member list of the cluster at endpoints
// shows the logger published (from then on the cluster knows it for a
// logger, and a second one may be added beside it).
func (lp *benchLogger) waitPublished(ctx context.Context, endpoints []string) error {
	cli, err := cluster.NewClient(endpoints)
	if err != nil {
		return err
	}
	defer cli.Close()
	marked := lp.clientURL + "/strata-logger"
	deadline := time.Now().Add(30 * time.Second)
	for {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := cli.MemberList(lctx)
		cancel()
		if err == nil && published(resp.Members, marked) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("logger %s never published its attributes: %v", lp.name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// attachLogger starts a logger in dir joined to the cluster at endpoints
// and waits until it published.
func attachLogger(ctx context.Context, bin, dir, name string, endpoints []string) (*benchLogger, uint64, error) {
	lp, err := newBenchLogger(bin, dir, name)
	if err != nil {
		return nil, 0, err
	}
	cid, err := lp.join(ctx, endpoints)
	if err != nil {
		return nil, 0, err
	}
	if err := lp.start(); err != nil {
		return nil, 0, err
	}
	return lp, cid, lp.waitPublished(ctx, endpoints)
}

func published(members []*etcdserverpb.Member, marked string) bool {
	for _, m := range members {
		for _, u := range m.ClientURLs {
			if u == marked {
				return true
			}
		}
	}
	return false
}

// metric reads one metric of one cluster from the logger's /metrics.
func (lp *benchLogger) metric(name string, clusterID uint64) (float64, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(lp.clientURL + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, fmt.Sprintf("%s{cluster_id=%q}", name, fmt.Sprintf("%x", clusterID))) {
			f := strings.Fields(line)
			return strconv.ParseFloat(f[len(f)-1], 64)
		}
	}
	return 0, fmt.Errorf("logger %s: no %s of cluster %x in /metrics", lp.name, name, clusterID)
}

// stop ends the logger with SIGTERM, SIGKILL after 20 s, and waits.
func (lp *benchLogger) stop() {
	if lp.cmd == nil || lp.cmd.Process == nil {
		return
	}
	_ = lp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-lp.done:
	case <-time.After(20 * time.Second):
		_ = lp.cmd.Process.Kill()
		<-lp.done
	}
}

// twoFreePorts returns two distinct free loopback ports.
func twoFreePorts() ([2]int, error) {
	var ports [2]int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return ports, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// writeLGReport writes logger.json and logger.md into out.
func writeLGReport(rep *lgReport, out string) error {
	raw, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "logger.json"), raw, 0o644); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# strata's loggers (seed 003)\n\n")
	fmt.Fprintf(&b, "Command: `%s` (%s, commit %s), %d puts of %d-byte values per run and cluster, fresh clusters of three per run.\n\n",
		rep.Command, rep.Strata, rep.Commit, rep.Total, rep.ValueSize)
	m := rep.Machine
	fmt.Fprintf(&b, "Machine: %d CPUs (%s), %s, kernel %s, disk %s, %s; load average at start %s, at end %s.\n\n",
		m.NProc, m.CPUModel, m.Memory, m.Kernel, m.Disk, m.GoVersion, m.LoadStart, m.LoadEnd)
	if len(rep.Results) > 0 {
		b.WriteString("## A cluster of three with 0, 1, 2 loggers (003, Figure 2)\n\n")
		b.WriteString("| loggers | conns/clients | rep | put/s | p50 ms | p99 ms | errors | logger entries/s | logger lag at end | logger catch-up ms |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	}
	for _, r := range rep.Results {
		if r.Err != "" {
			fmt.Fprintf(&b, "| %d | %d/%d | %d | failed: %s | | | | | | |\n", r.Loggers, r.Conns, r.Clients, r.Rep, r.Err)
			continue
		}
		fmt.Fprintf(&b, "| %d | %d/%d | %d | %.0f | %.2f | %.2f | %d | %s | %s | %s |\n", r.Loggers, r.Conns, r.Clients, r.Rep,
			r.Throughput, r.P50Ms, r.P99Ms, r.Errors, floats(r.LoggerRate, "%.0f"), floats(r.LoggerLagAtEnd, "%.0f"), floats(r.CatchUpMs, "%.0f"))
	}
	if len(rep.Shared) > 0 {
		b.WriteString("\n## One logger shared by n clusters of three (003, Figures 3-4)\n\n")
		b.WriteString("| clusters | conns/clients per cluster | rep | cumulative put/s | per cluster put/s | p99 ms per cluster | errors | logger entries/s | logger max lag at end | logger catch-up ms |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range rep.Shared {
			if r.Err != "" {
				fmt.Fprintf(&b, "| %d | %d/%d | %d | failed: %s | | | | | | |\n", r.Clusters, r.Conns, r.Clients, r.Rep, r.Err)
				continue
			}
			fmt.Fprintf(&b, "| %d | %d/%d | %d | %.0f | %s | %s | %d | %.0f | %.0f | %.0f |\n", r.Clusters, r.Conns, r.Clients, r.Rep,
				r.Cumulative, floats(r.Throughput, "%.0f"), floats(r.P99Ms, "%.2f"), r.Errors, r.LoggerRate, r.MaxLagEnd, r.CatchUpMs)
		}
	}
	if r := rep.Cost; r != nil {
		b.WriteString("\n## Disk usage per minute under load (003, Equations 1-2)\n\n")
		if r.Err != "" {
			fmt.Fprintf(&b, "failed: %s\n", r.Err)
		} else {
			fmt.Fprintf(&b, "%.0f s of puts at %d/%d: %d puts (%d errors, the requests cut at the end), %.0f put/s.\n\n",
				r.Seconds, r.Conns, r.Clients, r.Ops, r.Errors, r.Throughput)
			b.WriteString("| per minute of load | MB |\n|---|---|\n")
			fmt.Fprintf(&b, "| a member's engine (etcd_mvcc_db_total_size_in_bytes) | %.1f |\n", r.MemberEngineMBPerMin)
			fmt.Fprintf(&b, "| a member's raft log (strata_raftlog_bytes, live) | %.1f |\n", r.MemberLogMBPerMin)
			fmt.Fprintf(&b, "| the logger's log (strata_logger_log_bytes) | %.1f |\n", r.LoggerLogMBPerMin)
		}
	}
	return os.WriteFile(filepath.Join(out, "logger.md"), []byte(b.String()), 0o644)
}

func floats(fs []float64, format string) string {
	var parts []string
	for _, f := range fs {
		parts = append(parts, fmt.Sprintf(format, f))
	}
	return strings.Join(parts, ", ")
}
