package main

// The log compaction experiment (issue 6): seed 000's chapter 5 on strata.
//
//	go run . logcompact                       # the full matrix (~40 minutes on 2 cores)
//	go run . logcompact -workloads AW -records 10000 -batches 0,300
//	go run . logcompact -render logcompact.json   # re-render logcompact.md
//
// For every configuration -- a YCSB workload, a key count, log compaction
// off (SL, strata's plain raft log) or on with a batch size (PL,
// --log-compaction --log-compaction-batch N), one or two --log-dirs, and a
// history setting -- it measures what 000 measures:
//
//  1. Throughput and latency of -ops operations (SL against PL: the cost of
//     compacting online).
//  2. The log after the run (000's Figures 12 and 13): `strata inspect log
//     --json` on the log directories after kill -9: the commands the log
//     stands for, the records it holds (a compacted batch holds one per key
//     state it kept; a segment one per entry), and its bytes, live and on
//     disk.
//  3. Recovery (000's Tables 3 to 6): restart time from exec to the first
//     linearizable read, and its breakdown from the start-up log lines
//     ("replayed compacted log batches": read and decode, select, apply;
//     "replayed raft log entries at start-up": opening the log, replaying
//     entries through raft), with --recovery-strategy naive and descending.
//     Twice: as crashed (the engine holds what Pebble flushed on its own
//     during the run, so only the tail is replayed), and from the whole run
//     (the engine as it was before the run, with the run's log: every
//     command of the run replayed, as 000 recovers 10^5 commands).
//
// So that the log holds the run and nothing else, each key count is loaded
// once into a template: load, stop (the engine is flushed), restart with
// --snapshot-count=1 --snapshot-catchup-entries=0 so that the node
// truncates the log after one entry, stop again. Every configuration starts
// from a copy of the template with --snapshot-count so large that the node
// never truncates the log during the run (000 disabled etcd's WAL
// snapshots for the same reason) and --snapshot-catchup-entries=0 (one
// member: no follower to keep entries for; with it, log compaction would
// leave that many entries uncompacted).
//
// etcd runs the same workloads from a template of its own, with
// --snapshot-count as large, for its WAL size and its recovery time of the
// same data (000's SL is etcd's WAL).

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/bench/internal/cluster"
	"github.com/strata-kv/strata/bench/internal/load"
	"github.com/strata-kv/strata/bench/internal/report"
)

// lcOptions configures the log compaction experiment.
type lcOptions struct {
	out, repo, binDir, workDir string
	keep, quiet                bool
	seed                       uint64
	etcdBin, strataBin         string
	etcd                       bool // also run etcd

	workloads []string
	records   []int64
	batches   []int64 // 0 is SL
	// batchesLarge replaces batches for key counts above largeRecords.
	batchesLarge []int64
	ops          int64
	config       connClients
	valSize      int
	reps         int // recoveries per strategy and kind

	// The history-window series (PL only; SL's log does not depend on it).
	windowWorkloads []string
	windowRecords   []int64
	windowBatches   []int64
	windows         []string // --auto-compaction-retention values, periodic mode

	// The two-directory series.
	dirs2Workloads []string
	dirs2Records   []int64
	dirs2Batches   []int64

	render string // re-render this logcompact.json and exit
}

// defaultLCOptions are the sizes of the full run; see docs/bench/log-compaction.md
// for what they cut from 000's matrix and why.
func defaultLCOptions() lcOptions {
	return lcOptions{
		seed:            1,
		etcd:            true,
		workloads:       []string{"A", "B", "C", "D", "AW", "AWL"},
		records:         []int64{10000, 1000000},
		batches:         []int64{0, 300, 600, 900, 1200},
		batchesLarge:    []int64{0, 300, 1200},
		ops:             100000,
		config:          connClients{10, 100},
		valSize:         100,
		reps:            3,
		windowWorkloads: []string{"A", "AWL"},
		windowRecords:   []int64{10000},
		windowBatches:   []int64{1200},
		windows:         []string{"5m", "2s"},
		dirs2Workloads:  []string{"AW", "A"},
		dirs2Records:    []int64{10000},
		dirs2Batches:    []int64{0, 300, 1200},
	}
}

// largeRecords is the key count above which the main series runs
// lcOptions.batchesLarge: each configuration copies the whole engine
// several times.
const largeRecords = 100000

// smokeLCOptions are tiny sizes that still run every code path.
func smokeLCOptions() lcOptions {
	o := defaultLCOptions()
	o.workloads = []string{"AW"}
	o.records = []int64{200}
	o.batches = []int64{0, 50}
	o.batchesLarge = o.batches
	o.ops = 400
	o.reps = 1
	o.config = connClients{2, 4}
	o.windowWorkloads = []string{"AW"}
	o.windowRecords = []int64{200}
	o.windowBatches = []int64{50}
	o.windows = []string{"2s"}
	o.dirs2Workloads = []string{"AW"}
	o.dirs2Records = []int64{200}
	o.dirs2Batches = []int64{50}
	return o
}

func (o *lcOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.out, "out", o.out, "output directory (default <repo>/bench/results/<time>-logcompact)")
	fs.StringVar(&o.repo, "repo", o.repo, "strata repository root (default: found above the working directory)")
	fs.StringVar(&o.binDir, "bin-dir", o.binDir, "where built binaries go (default <repo>/bench/bin)")
	fs.StringVar(&o.workDir, "work-dir", o.workDir, "where server data directories go (default: the system temp dir); must not be tmpfs")
	fs.BoolVar(&o.keep, "keep", o.keep, "keep server data directories and logs after the run")
	fs.BoolVar(&o.quiet, "quiet", o.quiet, "no progress line, warnings only")
	fs.Uint64Var(&o.seed, "seed", o.seed, "random seed of the key choices")
	fs.StringVar(&o.etcdBin, "etcd-bin", o.etcdBin, "use this etcd binary instead of building tools/cmd/etcd")
	fs.StringVar(&o.strataBin, "strata-bin", o.strataBin, "use this strata binary instead of building cmd/strata")
	fs.BoolVar(&o.etcd, "etcd", o.etcd, "also run etcd on the main series, for its WAL size and recovery time")
	fs.Func("workloads", "YCSB workloads of the main series (A,B,C,D,AW,AWL)", listSetter(&o.workloads))
	fs.Func("records", "key counts of the main series, e.g. 10000,1000000", int64sSetter(&o.records))
	fs.Func("batches", "log compaction batch sizes of the main series; 0 is SL (log compaction off)", batchesSetter(&o.batches))
	fs.Func("batches-large", fmt.Sprintf("batch sizes of the main series for key counts above %d (fewer, to save time)", largeRecords), batchesSetter(&o.batchesLarge))
	fs.Int64Var(&o.ops, "ops", o.ops, "operations per configuration (000: 10^5 commands)")
	fs.Func("config", "conns/clients of the load, e.g. 10/100", oneConnClients(&o.config))
	fs.IntVar(&o.valSize, "val-size", o.valSize, "YCSB value size in bytes")
	fs.IntVar(&o.reps, "reps", o.reps, "recoveries per strategy (000 averaged 30); the report gives the mean and the minimum")
	fs.Func("window-workloads", "workloads of the history-window series (empty: none)", listSetter(&o.windowWorkloads))
	fs.Func("window-records", "key counts of the history-window series", int64sSetter(&o.windowRecords))
	fs.Func("window-batches", "batch sizes of the history-window series", batchesSetter(&o.windowBatches))
	fs.Func("windows", "history windows: --auto-compaction-retention values in periodic mode, e.g. 5m (Kubernetes' compaction interval),2s", listSetter(&o.windows))
	fs.Func("dirs2-workloads", "workloads of the two-log-directory series (empty: none)", listSetter(&o.dirs2Workloads))
	fs.Func("dirs2-records", "key counts of the two-log-directory series", int64sSetter(&o.dirs2Records))
	fs.Func("dirs2-batches", "batch sizes of the two-log-directory series; 0 is SL", batchesSetter(&o.dirs2Batches))
	fs.StringVar(&o.render, "render", o.render, "re-render logcompact.md (next to it) from this logcompact.json and exit")
}

// batchesSetter parses a comma-separated list of batch sizes, 0 allowed.
func batchesSetter(dst *[]int64) func(string) error {
	return func(s string) error {
		var out []int64
		for _, x := range strings.Split(s, ",") {
			if x = strings.TrimSpace(x); x == "" {
				continue
			}
			v, err := strconv.ParseInt(x, 10, 64)
			if err != nil || v < 0 {
				return fmt.Errorf("batch size %q: want an integer >= 0", x)
			}
			out = append(out, v)
		}
		*dst = out
		return nil
	}
}

// lcConfig is one configuration of the experiment.
type lcConfig struct {
	// Series is "main", "window" or "dirs2".
	Series string `json:"series"`
	// Server is "strata" or "etcd".
	Server   string `json:"server"`
	Workload string `json:"workload"`
	Records  int64  `json:"records"`
	// Batch is --log-compaction-batch; 0 is SL (log compaction off).
	Batch int64 `json:"batch"`
	// Dirs is the number of --log-dirs.
	Dirs int `json:"dirs"`
	// History is "latest" (--history latest) or the history window: the
	// periodic --auto-compaction-retention, e.g. "5m".
	History string `json:"history"`
}

// Mode is "SL", "PL-<batch>" or "etcd".
func (c lcConfig) Mode() string {
	switch {
	case c.Server == "etcd":
		return "etcd"
	case c.Batch == 0:
		return "SL"
	}
	return fmt.Sprintf("PL-%d", c.Batch)
}

func (c lcConfig) String() string {
	return fmt.Sprintf("%s %s %s records=%d dirs=%d history=%s", c.Series, c.Mode(), c.Workload, c.Records, c.Dirs, c.History)
}

// expand lists the configurations, grouped so that configurations sharing
// a template are adjacent.
func (o lcOptions) expand() []lcConfig {
	var out []lcConfig
	for _, n := range o.records {
		batches := o.batches
		if n > largeRecords {
			batches = o.batchesLarge
		}
		for _, w := range o.workloads {
			for _, b := range batches {
				out = append(out, lcConfig{Series: "main", Server: "strata", Workload: w, Records: n, Batch: b, Dirs: 1, History: "latest"})
			}
			if o.etcd {
				out = append(out, lcConfig{Series: "main", Server: "etcd", Workload: w, Records: n, Dirs: 1, History: "-"})
			}
		}
	}
	for _, n := range o.windowRecords {
		for _, w := range o.windowWorkloads {
			for _, win := range o.windows {
				for _, b := range o.windowBatches {
					if b > 0 {
						out = append(out, lcConfig{Series: "window", Server: "strata", Workload: w, Records: n, Batch: b, Dirs: 1, History: win})
					}
				}
			}
		}
	}
	for _, n := range o.dirs2Records {
		for _, w := range o.dirs2Workloads {
			for _, b := range o.dirs2Batches {
				out = append(out, lcConfig{Series: "dirs2", Server: "strata", Workload: w, Records: n, Batch: b, Dirs: 2, History: "latest"})
			}
		}
	}
	// Templates are per server, key count and directory count: run each
	// group together (stable, so the order within a group is kept).
	slices.SortStableFunc(out, func(a, b lcConfig) int {
		if c := strings.Compare(a.Server, b.Server); c != 0 {
			return -c // strata first
		}
		if a.Dirs != b.Dirs {
			return a.Dirs - b.Dirs
		}
		return int(a.Records - b.Records)
	})
	return out
}

// lcReport is the experiment's JSON output (logcompact.json).
type lcReport struct {
	Started  time.Time           `json:"started"`
	Finished time.Time           `json:"finished,omitzero"`
	Command  string              `json:"command"`
	Machine  report.Machine      `json:"machine"`
	Servers  []report.ServerInfo `json:"servers"`
	Ops      int64               `json:"ops"`
	Conns    int                 `json:"conns"`
	Clients  int                 `json:"clients"`
	Results  []lcResult          `json:"results"`
	Notes    []string            `json:"notes,omitempty"`
}

// lcResult is what one configuration measured.
type lcResult struct {
	Config lcConfig `json:"config"`
	// The run.
	Ops        int64          `json:"ops"`
	Errors     int64          `json:"errors"`
	Seconds    float64        `json:"seconds"`
	Throughput float64        `json:"ops_per_sec"`
	Latency    report.Latency `json:"latency"`
	Usage      cluster.Usage  `json:"usage"`
	// Writes is the number of revisions the run created: the commands that
	// entered the log.
	Writes int64 `json:"writes"`
	// Uncompacted is, for PL, the applied entries still in segments when
	// the server was killed (fewer than a batch once log compaction caught
	// up).
	Uncompacted int64 `json:"uncompacted,omitempty"`
	// Log is strata's raft log after the run.
	Log *lcLog `json:"log,omitempty"`
	// WAL is etcd's WAL after the run (member/wal): disk bytes, and the
	// bytes of files the run added.
	WALDiskBytes  int64 `json:"wal_disk_bytes,omitempty"`
	WALAddedBytes int64 `json:"wal_added_bytes,omitempty"`
	// Recoveries, in the order taken.
	Recoveries []lcRecovery `json:"recoveries"`
	// Error is set if the configuration failed; what was measured before
	// the failure stays.
	Error string `json:"error,omitempty"`
}

// lcLog summarises `strata inspect log --json` after the run.
type lcLog struct {
	SnapshotIndex uint64 `json:"snapshot_index"`
	BatchFiles    int    `json:"batch_files"`
	// BatchCommands are the entries the batch files stand for,
	// BatchRecords the records they hold.
	BatchCommands uint64 `json:"batch_commands"`
	BatchRecords  uint64 `json:"batch_records"`
	BatchBytes    int64  `json:"batch_bytes"`
	Segments      int    `json:"segments"`
	// SegmentCommands and SegmentBytes are the entries above the snapshot
	// point and the bytes of their frames; SegmentFileBytes the segments'
	// file sizes (--log-segment-size each, preallocated).
	SegmentCommands  uint64 `json:"segment_commands"`
	SegmentBytes     int64  `json:"segment_bytes"`
	SegmentFileBytes int64  `json:"segment_file_bytes"`
}

// Commands is what the log stands for; Held what recovery reads (records
// of batches plus live entries); Bytes the live bytes; DiskBytes what the
// files occupy.
func (l *lcLog) Commands() uint64 { return l.BatchCommands + l.SegmentCommands }

// Held is the number of records recovery reads: batch records and live entries.
func (l *lcLog) Held() uint64 { return l.BatchRecords + l.SegmentCommands }

// Bytes is the batch files plus the live frames of the segments.
func (l *lcLog) Bytes() int64 { return l.BatchBytes + l.SegmentBytes }

// DiskBytes is the batch files plus the segment files, preallocation included.
func (l *lcLog) DiskBytes() int64 { return l.BatchBytes + l.SegmentFileBytes }

// lcRecovery is one restart.
type lcRecovery struct {
	// Kind is "crash" (restart as the kill -9 left it) or "run" (the
	// engine as it was before the run, with the run's log: the whole run
	// is replayed).
	Kind string `json:"kind"`
	// Strategy is --recovery-strategy ("" for etcd).
	Strategy string `json:"strategy"`
	// Seconds is exec to the first successful linearizable read.
	Seconds float64 `json:"seconds"`
	// From the start-up log lines (strata), in seconds.
	LogOpen     float64 `json:"log_open"`
	BatchRead   float64 `json:"batch_read_decode"`
	Select      float64 `json:"select"`
	BatchApply  float64 `json:"batch_apply"`
	EntryReplay float64 `json:"entry_replay"`
	Batches     int     `json:"batches"`
	Records     int     `json:"records"`
	Applied     int     `json:"records_applied"`
	Entries     uint64  `json:"entries_replayed"`
	// Breakdown is false when the log lines were not found.
	Breakdown bool `json:"breakdown"`
}

// runLogCompact is the logcompact subcommand.
func runLogCompact(ctx context.Context, sub string, args []string) error {
	o := defaultLCOptions()
	fs := flag.NewFlagSet(sub, flag.ContinueOnError)
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.render != "" {
		rep, err := readLCReport(o.render)
		if err != nil {
			return err
		}
		return writeLCMarkdown(rep, filepath.Join(filepath.Dir(o.render), "logcompact.md"))
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
	_, err = runLC(ctx, o, command, log)
	return err
}

// lcRun is one run of the experiment.
//
// Concurrency: one goroutine.
type lcRun struct {
	o        lcOptions
	log      *zap.Logger
	rep      *lcReport
	workDir  string
	progress io.Writer
	errs     []error
	nextDir  int
}

// runLC runs every configuration of o and writes logcompact.json and
// logcompact.md into o.out; it returns the report (also on error).
func runLC(ctx context.Context, o lcOptions, command string, log *zap.Logger) (*lcReport, error) {
	if o.ops < 1 || o.reps < 1 {
		return nil, fmt.Errorf("-ops %d and -reps %d must be at least 1", o.ops, o.reps)
	}
	started := time.Now().UTC()
	workDir, err := runDirs(&o.repo, &o.binDir, &o.out, o.workDir, "logcompact", "strata-logcompact-", started)
	if err != nil {
		return nil, err
	}
	if !o.keep {
		defer os.RemoveAll(workDir)
	}
	r := &lcRun{o: o, log: log, workDir: workDir, rep: &lcReport{
		Started: started, Command: command, Machine: machineInfo(workDir),
		Ops: o.ops, Conns: o.config.conns, Clients: o.config.clients,
	}}
	if !o.quiet {
		r.progress = os.Stderr
	}
	if tmp, err := onTmpfs(workDir); err != nil {
		r.note("could not tell whether %s is tmpfs: %v", workDir, err)
	} else if tmp {
		r.note("data directories are on tmpfs (%s): fsync is free there, so durability costs are not measured", workDir)
	}
	configs := o.expand()
	if err := r.resolveBinaries(ctx, configs); err != nil {
		return r.rep, err
	}
	log.Info("log compaction experiment", zap.Int("configurations", len(configs)), zap.String("out", o.out), zap.String("work", workDir))
	var tmpl *lcTemplate
	var failed *lcTemplate // the group whose template could not be made
	for i, c := range configs {
		if ctx.Err() != nil {
			break
		}
		if failed != nil && failed.serves(c) {
			r.rep.Results = append(r.rep.Results, lcResult{Config: c, Error: "no template"})
			continue
		}
		if tmpl == nil || !tmpl.serves(c) {
			if tmpl != nil {
				tmpl.close(o.keep)
			}
			tmpl, err = r.prepareTemplate(ctx, c)
			if err != nil {
				r.fail(fmt.Errorf("template for %s: %w", c, err))
				failed = &lcTemplate{server: c.Server, records: c.Records, dirs: c.Dirs}
				r.rep.Results = append(r.rep.Results, lcResult{Config: c, Error: "no template"})
				tmpl = nil
				continue
			}
		}
		log.Info("configuration", zap.Int("n", i+1), zap.Int("of", len(configs)), zap.Stringer("config", c))
		res := r.runConfig(ctx, tmpl, c)
		r.rep.Results = append(r.rep.Results, res)
		if err := writeLCReport(r.rep, filepath.Join(o.out, "logcompact.json")); err != nil {
			log.Warn("save partial results", zap.Error(err))
		}
	}
	if tmpl != nil {
		tmpl.close(o.keep)
	}
	if err := ctx.Err(); err != nil {
		r.errs = append(r.errs, fmt.Errorf("run interrupted: %w", err))
	}
	r.rep.Machine.LoadEnd = loadAvg()
	r.rep.Finished = time.Now().UTC()
	if err := writeLCReport(r.rep, filepath.Join(o.out, "logcompact.json")); err != nil {
		r.errs = append(r.errs, err)
	}
	if err := writeLCMarkdown(r.rep, filepath.Join(o.out, "logcompact.md")); err != nil {
		r.errs = append(r.errs, err)
	}
	log.Info("wrote results", zap.String("dir", o.out))
	return r.rep, errors.Join(r.errs...)
}

// note records a caveat in the report and the log.
func (r *lcRun) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.log.Warn(msg)
	r.rep.Notes = append(r.rep.Notes, msg)
}

// fail records a failure and lets the run go on.
func (r *lcRun) fail(err error) {
	r.log.Error("measurement failed", zap.Error(err))
	r.rep.Notes = append(r.rep.Notes, "failed: "+err.Error())
	r.errs = append(r.errs, err)
}

// resolveBinaries builds (or takes) strata and, if a configuration needs
// it, etcd.
func (r *lcRun) resolveBinaries(ctx context.Context, configs []lcConfig) error {
	o := &r.o
	if o.strataBin == "" {
		r.log.Info("building strata", zap.String("bin", o.binDir))
		bin, err := buildStrata(ctx, o.repo, o.binDir)
		if err != nil {
			return err
		}
		o.strataBin = bin
	}
	version := binaryVersion(ctx, o.strataBin)
	if rev := gitHead(ctx, o.repo); rev != "" {
		version = "strata at commit " + rev + " (" + version + ")"
	}
	r.rep.Servers = append(r.rep.Servers, report.ServerInfo{Name: "strata", Binary: o.strataBin, Version: version})
	if !slices.ContainsFunc(configs, func(c lcConfig) bool { return c.Server == "etcd" }) {
		return nil
	}
	if o.etcdBin == "" {
		r.log.Info("building etcd from the tools module", zap.String("bin", o.binDir))
		bin, err := buildEtcd(ctx, o.repo, o.binDir)
		if err != nil {
			return err
		}
		o.etcdBin = bin
	}
	r.rep.Servers = append(r.rep.Servers, report.ServerInfo{Name: "etcd", Binary: o.etcdBin, Version: binaryVersion(ctx, o.etcdBin)})
	return nil
}

// lcTemplate is a loaded key space and the cluster that runs every
// configuration on a copy of it. Between configurations the cluster is
// stopped; its ports and directories stay.
type lcTemplate struct {
	server   string
	records  int64
	dirs     int
	c        *cluster.Cluster
	dir      string   // the cluster's directory
	pristine string   // a copy of member 0's directory after preparation
	logDirs  []string // strata's --log-dirs
	dirArgs  []string // flags naming the extra log directories
}

func (t *lcTemplate) serves(c lcConfig) bool {
	return t.server == c.Server && t.records == c.Records && t.dirs == c.Dirs
}

func (t *lcTemplate) close(keep bool) {
	if err := t.c.Stop(); err != nil {
		_ = err // the cluster is already stopped between configurations
	}
	if !keep {
		os.RemoveAll(t.dir)
	}
}

// runFlags are the flags every measured run and recovery gets: the node
// never truncates the log (the log holds the whole run), and keeps no
// catch-up entries (one member).
var runFlags = []string{"--snapshot-count=1000000000", "--snapshot-catchup-entries=0"}

// prepareTemplate loads c.Records keys into a fresh cluster of c.Server
// with c.Dirs log directories and leaves the cluster stopped, its log
// truncated to the engine (strata), with a pristine copy of its files.
func (r *lcRun) prepareTemplate(ctx context.Context, c lcConfig) (*lcTemplate, error) {
	r.nextDir++
	dir := filepath.Join(r.workDir, fmt.Sprintf("%03d-%s-%d-dirs%d", r.nextDir, c.Server, c.Records, c.Dirs))
	spec := cluster.Spec{Name: c.Server, Kind: cluster.KindStrata, Binary: r.o.strataBin}
	t := &lcTemplate{server: c.Server, records: c.Records, dirs: c.Dirs, dir: dir}
	if c.Server == "etcd" {
		spec = cluster.Spec{Name: "etcd", Kind: cluster.KindEtcd, Binary: r.o.etcdBin}
	} else {
		for i := 2; i <= c.Dirs; i++ {
			t.dirArgs = append(t.dirArgs, "--log-dir="+filepath.Join(dir, "m0", fmt.Sprintf("raftlog%d", i)))
		}
	}
	spec.ExtraArgs = t.dirArgs
	start := time.Now()
	cl, err := cluster.Start(ctx, spec, dir, r.log)
	if err != nil {
		return nil, err
	}
	t.c = cl
	fail := func(err error) (*lcTemplate, error) {
		_ = cl.Stop()
		if !r.o.keep {
			os.RemoveAll(dir)
		}
		return nil, err
	}
	if cl.LogDir() != "" {
		t.logDirs = []string{cl.LogDir()}
		for _, a := range t.dirArgs {
			t.logDirs = append(t.logDirs, strings.TrimPrefix(a, "--log-dir="))
		}
	}
	if err := load.Load(ctx, cl.Endpoints(), c.Records, r.o.valSize, r.progress, fmt.Sprintf("%s load %d", c.Server, c.Records)); err != nil {
		return fail(err)
	}
	if err := cl.Stop(); err != nil {
		return fail(err)
	}
	if c.Server == "strata" {
		// Truncate the log to the engine: one more entry (the leader's
		// empty entry after the restart, and a marker put) makes the node
		// flush and truncate with --snapshot-count=1; the tiny segment size
		// makes the truncation's state frame open a fresh segment, so the
		// load's frames go with the old one.
		cl.SetExtraArgs(append(slices.Clone(t.dirArgs), "--snapshot-count=1", "--snapshot-catchup-entries=0", "--log-segment-size=4096"))
		if _, err := cl.Restart(ctx); err != nil {
			return fail(err)
		}
		if err := putMarker(ctx, cl); err != nil {
			return fail(err)
		}
		if err := waitLogTruncated(ctx, cl); err != nil {
			return fail(err)
		}
		if err := cl.Stop(); err != nil {
			return fail(err)
		}
	}
	t.pristine = filepath.Join(dir, "pristine")
	if err := copyTree(cl.MemberDir(), t.pristine); err != nil {
		return fail(err)
	}
	r.log.Info("template ready", zap.String("server", c.Server), zap.Int64("records", c.Records), zap.Int("dirs", c.Dirs),
		zap.Duration("took", time.Since(start)))
	return t, nil
}

// putMarker writes one key, so that an entry is applied.
func putMarker(ctx context.Context, c *cluster.Cluster) error {
	cli, err := c.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "strata-bench-template", "1"); err != nil {
		return fmt.Errorf("put marker: %w", err)
	}
	return nil
}

// waitLogTruncated waits until strata's raft log holds at most one entry
// (the marker, if the node was still flushing when it was applied).
func waitLogTruncated(ctx context.Context, c *cluster.Cluster) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		first, ok1, err1 := c.Gauge("strata_raftlog_first_index")
		last, ok2, err2 := c.Gauge("strata_raftlog_last_index")
		if err := errors.Join(err1, err2); err == nil && ok1 && ok2 && first >= last {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("raft log not truncated after 30 s (first index %v, last %v, %v)", first, last, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// restore replaces member 0's directory with a copy of src; if dataFrom is
// not empty, the data directory (strata's engine, etcd's bbolt file) comes
// from there instead: the engine as it was before the run, with the log
// the run left.
func restore(t *lcTemplate, src, dataFrom string) error {
	mdir := t.c.MemberDir()
	keep := map[string]bool{"server.log": true}
	entries, err := os.ReadDir(mdir)
	if err != nil {
		return fmt.Errorf("restore %s: %w", mdir, err)
	}
	for _, e := range entries {
		if !keep[e.Name()] {
			if err := os.RemoveAll(filepath.Join(mdir, e.Name())); err != nil {
				return fmt.Errorf("restore %s: %w", mdir, err)
			}
		}
	}
	if dataFrom == "" {
		return copyTree(src, mdir, "server.log")
	}
	rel, err := filepath.Rel(mdir, t.c.DataDir())
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	var engine string // the part of the data directory that is state, not log
	switch t.server {
	case "etcd":
		engine = filepath.Join(rel, "member", "snap", "db")
	default:
		engine = filepath.Join(rel, "engine")
	}
	if err := copyTree(src, mdir, "server.log", engine); err != nil {
		return err
	}
	src = filepath.Join(dataFrom, engine)
	if st, err := os.Stat(src); err == nil && !st.IsDir() {
		return copyFile(src, filepath.Join(mdir, engine))
	}
	return copyTree(src, filepath.Join(mdir, engine))
}

// copyTree copies the regular files under src to dst (created), skipping
// the paths (relative to src) in skip.
func copyTree(src, dst string, skip ...string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if slices.Contains(skip, rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case !d.Type().IsRegular():
			return nil // sockets, symlinks: none in a data directory
		}
		return copyFile(path, target)
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("copy to %s: %w", dst, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("copy to %s: %w", dst, err)
	}
	return nil
}

// configArgs are the flags of c's runs (besides runFlags and the template's
// directories).
func configArgs(c lcConfig) []string {
	if c.Server == "etcd" {
		return slices.Clone(runFlags)
	}
	args := slices.Clone(runFlags)
	if c.Batch > 0 {
		args = append(args, "--log-compaction", fmt.Sprintf("--log-compaction-batch=%d", c.Batch))
		if c.History == "latest" {
			args = append(args, "--history=latest")
		} else {
			args = append(args, "--auto-compaction-mode=periodic", "--auto-compaction-retention="+c.History)
		}
	}
	return args
}

// fingerprint is what must survive a crash: the store's revision (every
// acknowledged write made one) and, for key spaces small enough to count
// quickly, the number of keys.
type fingerprint struct {
	keys int64 // -1: not counted
	rev  int64
}

// countLimit is the largest key space readFingerprint counts; above it a
// count would take seconds per restart.
const countLimit = 100000

func readFingerprint(ctx context.Context, c *cluster.Cluster, records int64) (fingerprint, error) {
	cli, err := c.Client()
	if err != nil {
		return fingerprint{}, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if records > countLimit {
		resp, err := cli.Get(ctx, load.YCSBKey(0))
		if err != nil {
			return fingerprint{}, fmt.Errorf("read revision: %w", err)
		}
		return fingerprint{keys: -1, rev: resp.Header.Revision}, nil
	}
	resp, err := cli.Get(ctx, "user", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fingerprint{}, fmt.Errorf("count keys: %w", err)
	}
	return fingerprint{keys: resp.Count, rev: resp.Header.Revision}, nil
}

// runConfig measures one configuration on a copy of its template.
func (r *lcRun) runConfig(ctx context.Context, t *lcTemplate, c lcConfig) lcResult {
	res := lcResult{Config: c}
	if err := r.measureConfig(ctx, t, c, &res); err != nil {
		res.Error = err.Error()
		r.fail(fmt.Errorf("%s: %w", c, err))
	}
	if err := t.c.Stop(); err != nil {
		r.log.Warn("stop", zap.Error(err))
	}
	return res
}

func (r *lcRun) measureConfig(ctx context.Context, t *lcTemplate, c lcConfig, res *lcResult) error {
	cl := t.c
	if err := restore(t, t.pristine, ""); err != nil {
		return err
	}
	args := append(slices.Clone(t.dirArgs), configArgs(c)...)
	cl.SetExtraArgs(args)
	if _, err := cl.Restart(ctx); err != nil {
		return err
	}
	before, err := readFingerprint(ctx, cl, c.Records)
	if err != nil {
		return err
	}
	w, err := load.YCSBWorkload(c.Workload, "", c.Records, r.o.valSize)
	if err != nil {
		return err
	}
	cfg := load.Config{Endpoints: cl.Endpoints(), Conns: r.o.config.conns, Clients: r.o.config.clients, Total: r.o.ops,
		Records: c.Records, Seed: r.o.seed, Progress: r.progress, Label: fmt.Sprintf("%s %s %s", c.Mode(), c.Workload, c.Series)}
	if err := cl.ResetPeakRSS(); err != nil {
		r.log.Warn("peak RSS covers the whole process life", zap.Error(err))
	}
	s0, err := cl.Sample()
	if err != nil {
		return err
	}
	lr, runErr := load.Run(ctx, w, cfg)
	s1, err := cl.Sample()
	if err != nil {
		return errors.Join(runErr, err)
	}
	res.Ops, res.Errors = lr.Ops, lr.Errors
	res.Seconds, res.Throughput = lr.Elapsed.Seconds(), lr.Throughput()
	if lr.Hist != nil {
		var rr report.Result
		rr.Summarize(lr.Hist)
		res.Latency = rr.Latency
	}
	res.Usage = s1.Sub(s0, cl.FsyncSource())
	if runErr != nil {
		return runErr
	}
	if lr.Errors > 0 {
		return fmt.Errorf("%d of %d requests failed, first: %w", lr.Errors, lr.Ops, lr.FirstError)
	}
	after, err := readFingerprint(ctx, cl, c.Records)
	if err != nil {
		return err
	}
	res.Writes = after.rev - before.rev
	if c.Server == "strata" && c.Batch > 0 {
		res.Uncompacted = waitCompacted(ctx, cl, c.Batch)
	}
	if err := cl.Kill(); err != nil {
		return err
	}

	// The log the run left.
	if c.Server == "strata" {
		l, err := r.inspectLog(ctx, t.logDirs)
		if err != nil {
			return err
		}
		res.Log = l
	} else {
		wal := filepath.Join(cl.DataDir(), "member", "wal")
		disk, apparent, err := treeSize(wal)
		if err != nil {
			return err
		}
		_, before, err := treeSize(filepath.Join(t.pristine, mustRel(cl.MemberDir(), wal)))
		if err != nil {
			return err
		}
		res.WALDiskBytes, res.WALAddedBytes = disk, apparent-before
	}
	crash := filepath.Join(t.dir, "crash")
	if err := os.RemoveAll(crash); err != nil {
		return err
	}
	if err := copyTree(cl.MemberDir(), crash, "server.log"); err != nil {
		return err
	}
	defer os.RemoveAll(crash)

	strategies := []string{""}
	if c.Server == "strata" {
		strategies = []string{"naive"}
		if c.Batch > 0 {
			strategies = append(strategies, "descending")
		}
	}
	// As crashed: once, naive (the strategy matters little when Pebble
	// flushed most of the run).
	rec, err := r.recover(ctx, t, c, args, strategies[0], "crash", "", "", after)
	if err != nil {
		return fmt.Errorf("restart as crashed: %w", err)
	}
	res.Recoveries = append(res.Recoveries, rec)
	// From the engine before the run: the whole run replayed.
	for rep := 0; rep < r.o.reps; rep++ {
		for _, st := range strategies {
			rec, err := r.recover(ctx, t, c, args, st, "run", crash, t.pristine, after)
			if err != nil {
				return fmt.Errorf("recovery of the whole run (%s): %w", st, err)
			}
			res.Recoveries = append(res.Recoveries, rec)
		}
	}
	return nil
}

func mustRel(base, path string) string {
	rel, err := filepath.Rel(base, path)
	if err != nil {
		return path
	}
	return rel
}

// waitCompacted waits (up to 10 s) until fewer than batch applied entries
// are left in strata's segments, and returns how many are.
func waitCompacted(ctx context.Context, c *cluster.Cluster, batch int64) int64 {
	deadline := time.Now().Add(10 * time.Second)
	var left int64 = -1
	for {
		first, ok1, err1 := c.Gauge("strata_raftlog_first_index")
		applied, ok2, err2 := c.Gauge("etcd_server_proposals_applied_total")
		if err1 == nil && err2 == nil && ok1 && ok2 {
			left = int64(applied) - int64(first) + 1
			if left < batch {
				return left
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recover restores member 0 from crash (and, if dataFrom is set, its
// engine from there; with crash "", it restarts on the files as they are),
// restarts it with strategy and times it, checks that the state is want,
// reads the start-up log lines, and kills it again.
func (r *lcRun) recover(ctx context.Context, t *lcTemplate, c lcConfig, args []string, strategy, kind, crash, dataFrom string, want fingerprint) (lcRecovery, error) {
	rec := lcRecovery{Kind: kind, Strategy: strategy}
	if crash != "" {
		if err := restore(t, crash, dataFrom); err != nil {
			return rec, err
		}
	}
	a := slices.Clone(args)
	if strategy != "" {
		a = append(a, "--recovery-strategy="+strategy, "--log-level=info")
	}
	t.c.SetExtraArgs(a)
	logPath := t.c.ServerLogPath()
	var offset int64
	if st, err := os.Stat(logPath); err == nil {
		offset = st.Size()
	}
	d, err := t.c.Restart(ctx)
	if err != nil {
		// The work directory goes at the end of the run: keep why.
		return rec, fmt.Errorf("%w; its log ends: %s", err, logTail(logPath, offset, 1500))
	}
	rec.Seconds = d.Seconds()
	got, err := readFingerprint(ctx, t.c, c.Records)
	if err != nil {
		return rec, err
	}
	if got != want {
		return rec, fmt.Errorf("after recovery: %d keys at revision %d, before the crash %d at %d", got.keys, got.rev, want.keys, want.rev)
	}
	if c.Server == "strata" {
		rec.Breakdown = readStartupLines(logPath, offset, &rec)
	}
	if err := t.c.Kill(); err != nil {
		return rec, err
	}
	return rec, nil
}

// readStartupLines fills rec from the start-up log lines written after
// offset (JSON, durations in seconds), waiting up to 2 s for the line that
// the member writes once the entries are replayed. It reports whether that
// line was found.
func readStartupLines(path string, offset int64, rec *lcRecovery) bool {
	deadline := time.Now().Add(2 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err == nil && int64(len(b)) >= offset {
			found := false
			for _, line := range strings.Split(string(b[offset:]), "\n") {
				if !strings.HasPrefix(line, "{") {
					continue
				}
				var m map[string]any
				if json.Unmarshal([]byte(line), &m) != nil {
					continue
				}
				num := func(k string) float64 {
					v, _ := m[k].(float64)
					return v
				}
				switch m["msg"] {
				case "replayed compacted log batches":
					rec.BatchRead, rec.Select, rec.BatchApply = num("read-decode"), num("select"), num("apply")
					rec.Batches, rec.Records, rec.Applied = int(num("batches")), int(num("records")), int(num("records-applied"))
				case "replayed raft log entries at start-up":
					rec.LogOpen, rec.EntryReplay, rec.Entries = num("log-open"), num("replay"), uint64(num("entries-replayed"))
					found = true
				case "opened raft log":
					rec.LogOpen = num("log-open")
					found = true
				}
			}
			if found {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// inspectLog runs `strata inspect log --json` on the log directories.
func (r *lcRun) inspectLog(ctx context.Context, dirs []string) (*lcLog, error) {
	args := []string{"inspect", "log", "--json"}
	for _, d := range dirs {
		args = append(args, "--log-dir", d)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, r.o.strataBin, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("strata %s: %w: %s", strings.Join(args, " "), err, ee.Stderr)
		}
		return nil, fmt.Errorf("strata %s: %w", strings.Join(args, " "), err)
	}
	var files []struct {
		Compacted                   bool
		Commands, LiveCommands      uint64
		Records                     int
		Bytes, LiveBytes, FileBytes int64
		SnapshotIndex               uint64
	}
	if err := json.Unmarshal(out, &files); err != nil {
		return nil, fmt.Errorf("decode strata inspect log --json: %w", err)
	}
	l := &lcLog{}
	for _, f := range files {
		l.SnapshotIndex = max(l.SnapshotIndex, f.SnapshotIndex)
		if f.Compacted {
			l.BatchFiles++
			l.BatchCommands += f.Commands
			l.BatchRecords += uint64(f.Records)
			l.BatchBytes += f.Bytes
			continue
		}
		l.Segments++
		l.SegmentCommands += f.LiveCommands
		l.SegmentBytes += f.LiveBytes
		l.SegmentFileBytes += f.FileBytes
	}
	return l, nil
}

// treeSize returns the allocated and apparent sizes of the files under dir.
func treeSize(dir string) (allocated, apparent int64, err error) {
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		apparent += info.Size()
		allocated += allocatedBytes(info)
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("size of %s: %w", dir, err)
	}
	return allocated, apparent, nil
}

// writeLCReport writes rep as JSON, atomically.
func writeLCReport(rep *lcReport, path string) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename to %s: %w", path, err)
	}
	return nil
}

// readLCReport reads a report written by writeLCReport.
func readLCReport(path string) (*lcReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read report: %w", err)
	}
	var rep lcReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("decode report %s: %w", path, err)
	}
	return &rep, nil
}

// mean and minimum of xs (0 for none).
func meanMin(xs []float64) (mean, least float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	least = math.Inf(1)
	for _, x := range xs {
		mean += x
		least = min(least, x)
	}
	return mean / float64(len(xs)), least
}

// allocatedBytes is what a file occupies on disk (as du counts it).
func allocatedBytes(info fs.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return info.Size()
}

// logTail returns up to n bytes of the end of the file at path written
// after offset, or a note saying why there are none.
func logTail(path string, offset int64, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	if offset > int64(len(b)) {
		offset = 0
	}
	b = b[offset:]
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
