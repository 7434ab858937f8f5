// Command bench measures strata against real etcd on the same machine, with
// the same load and the same durability, in one run.
//
// It builds (or is given) both servers, starts single-member clusters of each
// on free loopback ports with temporary data directories, drives them with
// one clientv3 load generator, and records throughput, HDR-histogram latency
// percentiles, server CPU seconds, peak RSS, bytes written, fsyncs (when the
// server exports a counter), data directory size and restart time after
// kill -9. Results go to results.json, results.md (with strata/etcd ratios)
// and PNG plots in the output directory.
//
// Usage (from the bench directory, or `go run -C bench . ...` from the root):
//
//	go run . smoke                      # every code path, tiny sizes, seconds
//	go run . put -put-total 2000        # etcd's benchmark put at 1/1 .. 100/1000
//	go run . range                      # benchmark range, linearizable and serializable
//	go run . ycsb -ycsb-records 10000   # YCSB A B C D AW AWL
//	go run . sweep                      # saturation sweep over client counts
//	go run . restart                    # restart time after kill -9 with N keys
//	go run . defrag                     # write stall during Defragment
//	go run . all                        # every step above (-steps to choose)
//	go run . report -in results.json    # re-render Markdown and plots
//	go run . logcompact                 # log compaction: SL against PL (logcompact.go)
//	go run . backup                     # incremental backups against full snapshots (backup.go)
//
// Servers are chosen with -servers (etcd, strata, strata-wal, strata-bbolt,
// strata-appendlog, strata-hybridlog, strata-base); strata-wal is strata
// with --engine-wal, strata-bbolt (and the other two) strata with --engine
// bbolt (docs/engines.md), strata-base the strata binary of another commit
// (-strata-base-bin), for a change's before and after in one run. See
// docs/bench/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/strata-kv/strata/bench/internal/report"
)

// steps are the measurement steps, in the order a full run takes them.
var steps = []string{"put", "range", "list", "ycsb", "sweep", "restart", "defrag"}

// connClients is one conns/clients setting, written "10/100".
type connClients struct{ conns, clients int }

// options is everything a run is configured with.
type options struct {
	steps   []string
	servers []string
	out     string
	repo    string
	binDir  string
	workDir string
	keep    bool
	quiet   bool
	seed    uint64
	members int
	// rounds > 1 interleaves the servers: put, range, ycsb and sweep run
	// every server once per round, in alternating order (suite.go).
	rounds int

	etcdBin, strataBin string
	// strataBaseBin is the binary of the strata-base server: strata built
	// from another commit, run with the same flags as strata.
	strataBaseBin string
	strataFsync   []string
	fsyncCount    string
	pprofSeconds  int // > 0: CPU profiles of every measurement (profile.go)

	putConfigs []connClients
	putTotal   int64
	keySize    int
	valSize    int
	keySpace   int64

	rangeConfigs []connClients
	rangeTotal   int64
	listKeys     []int64
	listConfigs  []connClients
	listTotal    int64
	listValSize  int
	listModes    []string
	consistency  []string

	ycsbWorkloads []string
	ycsbRecords   []int64
	ycsbDists     []string
	ycsbOps       int64
	ycsbConfig    connClients
	ycsbValSize   int

	sweepClients []int
	sweepTotal   int64

	restartKeys []int64

	defragKeys    []int64
	defragClients int
	defragWindow  time.Duration
}

// defaultOptions are the sizes of a full run.
func defaultOptions() options {
	return options{
		steps:         steps,
		servers:       []string{"etcd", "strata", "strata-wal"},
		seed:          1,
		fsyncCount:    "metrics",
		members:       1,
		rounds:        1,
		putConfigs:    []connClients{{1, 1}, {10, 10}, {100, 100}, {100, 1000}},
		putTotal:      10000,
		keySize:       8,
		valSize:       256,
		rangeConfigs:  []connClients{{1, 1}, {10, 10}, {100, 100}, {100, 1000}},
		rangeTotal:    10000,
		listKeys:      []int64{10000, 100000},
		listConfigs:   []connClients{{1, 1}, {10, 10}},
		listTotal:     100,
		listValSize:   1024,
		listModes:     []string{"range", "stream"},
		consistency:   []string{"l", "s"},
		ycsbWorkloads: []string{"A", "B", "C", "D", "AW", "AWL"},
		ycsbRecords:   []int64{10000, 1000000},
		ycsbDists:     []string{"std"},
		ycsbOps:       100000,
		ycsbConfig:    connClients{10, 100},
		ycsbValSize:   100,
		sweepClients:  []int{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024},
		sweepTotal:    10000,
		restartKeys:   []int64{100000, 1000000},
		defragKeys:    []int64{100000},
		defragClients: 10,
		defragWindow:  10 * time.Second,
	}
}

// smokeOptions are tiny sizes that still run every code path.
func smokeOptions() options {
	o := defaultOptions()
	o.putConfigs = []connClients{{1, 1}, {2, 4}}
	o.putTotal = 20
	o.rangeConfigs = []connClients{{1, 1}, {2, 4}}
	o.rangeTotal = 20
	o.listKeys = []int64{300}
	o.listConfigs = []connClients{{1, 1}, {2, 4}}
	o.listTotal = 10
	o.ycsbRecords = []int64{200}
	o.ycsbDists = []string{"std", "uniform"}
	o.ycsbOps = 30
	o.ycsbConfig = connClients{2, 4}
	o.sweepClients = []int{1, 4}
	o.sweepTotal = 20
	o.restartKeys = []int64{300}
	o.defragKeys = []int64{300}
	o.defragClients = 2
	o.defragWindow = 2 * time.Second
	return o
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// usage is printed for a missing or unknown subcommand.
const usage = `usage: bench <subcommand> [flags]

subcommands:
  put      etcd's benchmark put at each -put-configs
  range    etcd's benchmark range, -consistency l and s
  ycsb     YCSB -ycsb-workloads over -ycsb-records keys
  sweep    saturation sweep of put over -sweep-clients
  restart  restart time after kill -9 with -restart-keys keys
  defrag   longest write stall during Defragment, -defrag-keys keys
  all      every step in -steps
  smoke    every step on tiny sizes (seconds)
  report   re-render results.md and plots from -in results.json
  grow     writes as the data grows: each server in turn written to -grow-bytes, sampled every -grow-interval (grow.go)
  logcompact  seed 000's log compaction experiment on strata (logcompact.go)
  logger   seed 003's Figure 2 on strata: a cluster of three with 0, 1, 2 loggers (logger.go)
  backup   seed 004's Figures 4.18-4.19 on strata: incremental backups against full snapshots (backup.go)

run 'bench <subcommand> -h' for flags`

// run parses args and runs one subcommand.
func run(args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	sub, args := args[0], args[1:]
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch sub {
	case "report":
		return runReport(args)
	case "logcompact":
		return runLogCompact(ctx, sub, args)
	case "logger":
		return runLoggerBench(ctx, sub, args)
	case "backup":
		return runBackupBench(ctx, sub, args)
	case "grow":
		return runGrow(ctx, sub, args)
	case "put", "range", "ycsb", "sweep", "restart", "defrag", "all", "smoke":
	default:
		return fmt.Errorf("unknown subcommand %q\n%s", sub, usage)
	}
	o := defaultOptions()
	if sub == "smoke" {
		o = smokeOptions()
	}
	if slices.Contains(steps, sub) {
		o.steps = []string{sub}
	}
	fs := flag.NewFlagSet(sub, flag.ContinueOnError)
	registerFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
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
	_, err = runSuite(ctx, o, command, log)
	return err
}

// newLogger returns a console logger on stderr; quiet keeps warnings only.
func newLogger(quiet bool) (*zap.Logger, error) {
	cfg := zap.NewDevelopmentConfig()
	cfg.DisableStacktrace = true
	cfg.EncoderConfig.EncodeTime = zapcore.TimeEncoderOfLayout(time.TimeOnly)
	if quiet {
		cfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	}
	log, err := cfg.Build()
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	return log, nil
}

// runReport re-renders a results.json.
func runReport(args []string) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	in := fs.String("in", "results.json", "results file written by a run")
	out := fs.String("out", "", "directory for results.md and plots (default: the input's directory)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rep, err := report.ReadJSON(*in)
	if err != nil {
		return err
	}
	dir := *out
	if dir == "" {
		dir = filepath.Dir(*in)
	}
	files, err := report.Render(rep, dir)
	for _, f := range files {
		fmt.Println(f)
	}
	return err
}

// registerFlags binds every run flag to o; o's values are the defaults.
func registerFlags(fs *flag.FlagSet, o *options) {
	fs.Func("steps", "comma-separated steps for 'all': "+strings.Join(steps, ","), listSetter(&o.steps))
	fs.Func("servers", "comma-separated servers: etcd, strata, strata-wal, strata-bbolt, strata-appendlog, strata-hybridlog, strata-base (default "+strings.Join(o.servers, ",")+")", listSetter(&o.servers))
	fs.StringVar(&o.out, "out", o.out, "output directory (default <repo>/bench/results/<time>-<subcommand>)")
	fs.StringVar(&o.repo, "repo", o.repo, "strata repository root (default: found above the working directory)")
	fs.StringVar(&o.binDir, "bin-dir", o.binDir, "where built binaries go (default <repo>/bench/bin)")
	fs.StringVar(&o.workDir, "work-dir", o.workDir, "where server data directories go (default: the system temp dir); must not be tmpfs")
	fs.BoolVar(&o.keep, "keep", o.keep, "keep server data directories and logs after the run")
	fs.BoolVar(&o.quiet, "quiet", o.quiet, "no progress line, warnings only")
	fs.Uint64Var(&o.seed, "seed", o.seed, "random seed of the key choices")
	fs.IntVar(&o.members, "members", o.members, "members per cluster, all on this machine (Kill and restart act on member 0)")
	fs.IntVar(&o.rounds, "rounds", o.rounds, "put, range, ycsb, sweep, restart, defrag: measure every server this many times, in alternating order (round 1 in -servers order, round 2 reversed, ...), each on a fresh cluster; results.md shows medians and spreads")
	fs.StringVar(&o.etcdBin, "etcd-bin", o.etcdBin, "use this etcd binary instead of building tools/cmd/etcd")
	fs.StringVar(&o.strataBin, "strata-bin", o.strataBin, "use this strata binary instead of building cmd/strata")
	fs.StringVar(&o.strataBaseBin, "strata-base-bin", o.strataBaseBin, "the strata-base server's binary: strata built from another commit (e.g. git worktree add /tmp/base HEAD~1 && go build -C /tmp/base -o /tmp/strata-base ./cmd/strata)")
	fs.StringVar(&o.fsyncCount, "fsync-count", o.fsyncCount, "how fsyncs are counted: metrics (etcd's Prometheus counters; strata exports none) or strace (every server runs under strace, counting its sync calls; adds a ptrace stop per sync)")
	fs.Func("strata-fsync-metrics", "comma-separated Prometheus counters on strata's /metrics whose sum counts its fsyncs (default: the raft log's fdatasyncs, etcd_disk_wal_fsync_duration_seconds_count, plus etcd_disk_backend_commit_duration_seconds_count for strata-wal, whose every engine commit syncs)", listSetter(&o.strataFsync))
	fs.IntVar(&o.pprofSeconds, "pprof-seconds", o.pprofSeconds, "if > 0, start servers with --enable-pprof and save a CPU profile of member 0 over the first N seconds of every measurement in <out>/pprof/")

	fs.Func("put-configs", "conns/clients list for put, e.g. 1/1,10/10", ccSetter(&o.putConfigs))
	fs.Int64Var(&o.putTotal, "put-total", o.putTotal, "requests per put configuration")
	fs.IntVar(&o.keySize, "key-size", o.keySize, "put key size in bytes")
	fs.IntVar(&o.valSize, "val-size", o.valSize, "put and range value size in bytes")
	fs.Int64Var(&o.keySpace, "key-space", o.keySpace, "distinct put keys, written in sequence (0: one per request; etcd's tool defaults to 1)")

	fs.Func("range-configs", "conns/clients list for range", ccSetter(&o.rangeConfigs))
	fs.Int64Var(&o.rangeTotal, "range-total", o.rangeTotal, "requests per range configuration")
	fs.Func("list-keys", "key counts each list request reads, e.g. 10000,100000 (a Kubernetes LIST of one resource)", int64sSetter(&o.listKeys))
	fs.Func("list-configs", "conns/clients list for list", ccSetter(&o.listConfigs))
	fs.Int64Var(&o.listTotal, "list-total", o.listTotal, "requests per list configuration")
	fs.IntVar(&o.listValSize, "list-val-size", o.listValSize, "value size of the listed keys in bytes")
	fs.Func("list-modes", "how list reads: range (one Range response), stream (RangeStream, etcd 3.7)", listSetter(&o.listModes))
	fs.Func("consistency", "range consistencies: l (linearizable), s (serializable)", listSetter(&o.consistency))

	fs.Func("ycsb-workloads", "YCSB workloads: A,B,C,D,AW,AWL", listSetter(&o.ycsbWorkloads))
	fs.Func("ycsb-records", "comma-separated key counts to preload, e.g. 10000,1000000", int64sSetter(&o.ycsbRecords))
	fs.Func("ycsb-dists", "key distributions: std (each workload's own), uniform, zipfian, latest", listSetter(&o.ycsbDists))
	fs.Int64Var(&o.ycsbOps, "ycsb-ops", o.ycsbOps, "operations per YCSB workload")
	fs.Func("ycsb-config", "conns/clients for YCSB, e.g. 10/100", oneConnClients(&o.ycsbConfig))
	fs.IntVar(&o.ycsbValSize, "ycsb-val-size", o.ycsbValSize, "YCSB value size in bytes")

	fs.Func("sweep-clients", "client counts of the saturation sweep (conns = min(clients, 100))", func(s string) error {
		v, err := parseInt64s(s)
		if err != nil {
			return err
		}
		o.sweepClients = o.sweepClients[:0]
		for _, x := range v {
			o.sweepClients = append(o.sweepClients, int(x))
		}
		return nil
	})
	fs.Int64Var(&o.sweepTotal, "sweep-total", o.sweepTotal, "requests per sweep point")

	fs.Func("restart-keys", "key counts loaded before kill -9, e.g. 100000", int64sSetter(&o.restartKeys))

	fs.Func("defrag-keys", "key counts loaded (twice, then compacted) before Defragment, e.g. 100000", int64sSetter(&o.defragKeys))
	fs.IntVar(&o.defragClients, "defrag-clients", o.defragClients, "concurrent writers during Defragment")
	fs.DurationVar(&o.defragWindow, "defrag-window", o.defragWindow, "how long the writers run (at least until 1 s after the last Defragment returns)")
}

// listSetter parses a comma-separated list into *dst.
func listSetter(dst *[]string) func(string) error {
	return func(s string) error {
		*dst = nil
		for _, x := range strings.Split(s, ",") {
			if x = strings.TrimSpace(x); x != "" {
				*dst = append(*dst, x)
			}
		}
		return nil
	}
}

// ccSetter parses a conns/clients list into *dst.
func ccSetter(dst *[]connClients) func(string) error {
	return func(s string) error {
		v, err := parseConnClients(s)
		if err != nil {
			return err
		}
		*dst = v
		return nil
	}
}

// int64sSetter parses a comma-separated integer list into *dst.
func int64sSetter(dst *[]int64) func(string) error {
	return func(s string) error {
		v, err := parseInt64s(s)
		if err != nil {
			return err
		}
		*dst = v
		return nil
	}
}

// parseConnClients parses "1/1,10/100".
func parseConnClients(s string) ([]connClients, error) {
	var out []connClients
	for _, x := range strings.Split(s, ",") {
		x = strings.TrimSpace(x)
		if x == "" {
			continue
		}
		a, b, ok := strings.Cut(x, "/")
		if !ok {
			return nil, fmt.Errorf("conns/clients %q: want CONNS/CLIENTS", x)
		}
		conns, err1 := strconv.Atoi(a)
		clients, err2 := strconv.Atoi(b)
		if err1 != nil || err2 != nil || conns < 1 || clients < 1 {
			return nil, fmt.Errorf("conns/clients %q: want two positive integers", x)
		}
		out = append(out, connClients{conns, clients})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("conns/clients %q: empty list", s)
	}
	return out, nil
}

// parseInt64s parses "10000,1e6" (exponent notation allowed for readability).
func parseInt64s(s string) ([]int64, error) {
	var out []int64
	for _, x := range strings.Split(s, ",") {
		x = strings.TrimSpace(x)
		if x == "" {
			continue
		}
		v, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			f, ferr := strconv.ParseFloat(x, 64)
			if ferr != nil || f != float64(int64(f)) {
				return nil, fmt.Errorf("integer %q: %w", x, err)
			}
			v = int64(f)
		}
		if v < 1 {
			return nil, fmt.Errorf("integer %q: must be positive", x)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("integer list %q: empty", s)
	}
	return out, nil
}

// runDirs resolves the repository, binary and output directories a run
// uses (defaults below the repository; the output named by the start time
// and suffix) and creates them, and a fresh work directory, named by
// prefix, below workDir (default: the system temp dir). The caller
// removes the work directory.
func runDirs(repo, binDir, out *string, workDir, suffix, prefix string, started time.Time) (string, error) {
	if *repo == "" {
		wd, err := os.Getwd()
		if err != nil {
			return "", fmt.Errorf("working directory: %w", err)
		}
		if *repo, err = findRepo(wd); err != nil {
			return "", err
		}
	}
	if *binDir == "" {
		*binDir = filepath.Join(*repo, "bench", "bin")
	}
	if *out == "" {
		*out = filepath.Join(*repo, "bench", "results", started.Format("20060102-150405")+"-"+suffix)
	}
	for _, d := range []string{*out, *binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("create %s: %w", d, err)
		}
	}
	if workDir == "" {
		workDir = os.TempDir()
	}
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return "", fmt.Errorf("create work dir %s: %w", workDir, err)
	}
	dir, err := os.MkdirTemp(workDir, prefix)
	if err != nil {
		return "", fmt.Errorf("create work dir: %w", err)
	}
	return dir, nil
}

// oneConnClients is a flag setter for a single conns/clients pair.
func oneConnClients(dst *connClients) func(string) error {
	return func(s string) error {
		cc, err := parseConnClients(s)
		if err != nil {
			return err
		}
		if len(cc) != 1 {
			return fmt.Errorf("want one conns/clients pair, got %q", s)
		}
		*dst = cc[0]
		return nil
	}
}
