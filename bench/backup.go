package main

// Seed 004's incremental snapshotting experiments (its section 4.3,
// Figures 4.18-4.19) on strata, against full snapshots, in one run:
//
//	go run . backup                                  # defaults below
//	go run . backup -grow-steps 10 -grow-keys 50000 -update-steps 5 -restore-every 1
//	go run . backup -render backup.json              # re-render backup.md and the plots
//
// Two single-member clusters run side by side, strata and real etcd, and
// receive the same writes (YCSB-named keys, random, incompressible values of
// -val-size bytes; transactions of 100 puts, 16 at a time). After each step
// three snapshots are taken, in an order that rotates from step to step:
//
//   - strata-incremental: `strata backup create --endpoints URL --target
//     file://DIR` (docs/backup.md): the member checkpoints its engine and
//     uploads the files the target lacks (a files version) or, as its
//     --backup-log-ratio and --backup-full-every say, the raft log since
//     the target's last version (a log version). Its bytes are what the
//     target grew by; the size of a files version of the same state (the
//     checkpoint's bytes) is recorded too, as the "full version".
//   - strata-full: `etcdctl snapshot save FILE` against strata.
//   - etcd-full: `etcdctl snapshot save FILE` against etcd.
//
// A full snapshot's bytes are its file's size; its cumulative bytes are what
// keeping every one of them would take (004's MemOnly dumps the whole state
// at every snapshot), though the files are deleted once measured.
//
// Experiment "grow" (004's Figure 4.18): -grow-steps steps, each writing
// -grow-keys new keys. After each step (or every -restore-every steps) each
// snapshot is restored into a new data directory, timed (`strata restore
// --from URL --version V`, `strata restore FILE`, `etcdutl snapshot restore
// FILE`), and, with -restore-start, a server is started on it and timed
// until a linearizable read answers; the restored key count is checked.
//
// Experiment "update" (004's Figure 4.19): on the state "grow" left (or,
// without it, on -base-keys keys loaded at once, step 0), -update-steps
// steps each overwrite -update-pct percent of the keys, chosen at random;
// its report gives what that change cost the incremental backup, as a share
// of a full backup (the compass goal: at most 5%). With -update-restore,
// every snapshot of the last update step is restored, and, if the
// incremental one was a log version, a files version of the same state is
// taken (`--kind files`, outside the cumulative figures) and restored too:
// what the log's replay costs a restore.
//
// Neither server compacts revisions (both default to no auto-compaction),
// so an overwrite adds a revision to both.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/bench/internal/cluster"
	"github.com/strata-kv/strata/bench/internal/load"
	"github.com/strata-kv/strata/bench/internal/report"
)

// The snapshot methods measured.
const (
	methodIncremental = "strata-incremental"
	methodStrataFull  = "strata-full"
	methodEtcdFull    = "etcd-full"
)

// The experiments.
const (
	expGrow   = "grow"
	expUpdate = "update"
)

// bkOptions configures the backup experiment.
type bkOptions struct {
	out, repo, binDir, workDir string
	keep, quiet                bool
	seed                       uint64
	etcdBin, strataBin         string
	// etcdctlBin and etcdutlBin default to etcdctl and etcdutl beside
	// etcdBin.
	etcdctlBin, etcdutlBin string
	etcd                   bool // also measure etcd-full

	experiments  []string
	growSteps    int
	growKeys     int64
	updateSteps  int
	updatePct    float64
	baseKeys     int64 // update's large state when grow does not run
	valSize      int
	restoreEvery int  // 0: no restores
	restoreStart bool // start a server on each restored data dir
	// updateRestore restores the last update step's snapshots, and a
	// files version of the same state if the incremental one was a log
	// version.
	updateRestore bool
	// strataFlags are extra flags of the strata member (its version
	// policy: --backup-log-ratio, --backup-full-every).
	strataFlags []string

	render string
}

// defaultBKOptions are the sizes of docs/bench/backup.md's run.
func defaultBKOptions() bkOptions {
	return bkOptions{
		seed:          1,
		etcd:          true,
		experiments:   []string{expGrow, expUpdate},
		growSteps:     10,
		growKeys:      20000,
		updateSteps:   5,
		updatePct:     1,
		baseKeys:      200000,
		valSize:       1024,
		restoreEvery:  2,
		restoreStart:  true,
		updateRestore: true,
	}
}

// smokeBKOptions are tiny sizes that run every code path in seconds.
func smokeBKOptions() bkOptions {
	o := defaultBKOptions()
	o.growSteps, o.growKeys, o.updateSteps, o.baseKeys = 2, 300, 2, 600
	o.updatePct = 5
	o.valSize = 256
	return o
}

func (o *bkOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.out, "out", o.out, "output directory (default <repo>/bench/results/<time>-backup)")
	fs.StringVar(&o.repo, "repo", o.repo, "strata repository root (default: found above the working directory)")
	fs.StringVar(&o.binDir, "bin-dir", o.binDir, "where built binaries go (default <repo>/bench/bin)")
	fs.StringVar(&o.workDir, "work-dir", o.workDir, "where data directories, the backup target and snapshot files go (default: the system temp dir); must not be tmpfs")
	fs.BoolVar(&o.keep, "keep", o.keep, "keep the work directory (data dirs, target, every full snapshot file) after the run")
	fs.BoolVar(&o.quiet, "quiet", o.quiet, "no progress line, warnings only")
	fs.Uint64Var(&o.seed, "seed", o.seed, "random seed of the values and of the keys each update step overwrites")
	fs.StringVar(&o.etcdBin, "etcd-bin", o.etcdBin, "use this etcd binary (etcdctl and etcdutl beside it) instead of building tools/cmd/{etcd,etcdctl,etcdutl}")
	fs.StringVar(&o.etcdctlBin, "etcdctl-bin", o.etcdctlBin, "etcdctl binary (default: beside -etcd-bin, or built)")
	fs.StringVar(&o.etcdutlBin, "etcdutl-bin", o.etcdutlBin, "etcdutl binary (default: beside -etcd-bin, or built)")
	fs.StringVar(&o.strataBin, "strata-bin", o.strataBin, "use this strata binary instead of building cmd/strata")
	fs.BoolVar(&o.etcd, "etcd", o.etcd, "also run etcd and measure its full snapshots")
	fs.Func("experiments", "comma-separated experiments: grow (004 Figure 4.18), update (004 Figure 4.19)", func(s string) error {
		if err := listSetter(&o.experiments)(s); err != nil {
			return err
		}
		for _, e := range o.experiments {
			if e != expGrow && e != expUpdate {
				return fmt.Errorf("experiment %q: want grow or update", e)
			}
		}
		return nil
	})
	fs.IntVar(&o.growSteps, "grow-steps", o.growSteps, "grow: steps, a snapshot of each kind after each")
	fs.Int64Var(&o.growKeys, "grow-keys", o.growKeys, "grow: new keys written per step")
	fs.IntVar(&o.updateSteps, "update-steps", o.updateSteps, "update: steps, a snapshot of each kind after each")
	fs.Float64Var(&o.updatePct, "update-pct", o.updatePct, "update: percent of the keys overwritten per step (random, distinct within a step)")
	fs.Int64Var(&o.baseKeys, "base-keys", o.baseKeys, "update without grow: keys of the large state, loaded in step 0")
	fs.IntVar(&o.valSize, "val-size", o.valSize, "value bytes (random, incompressible)")
	fs.IntVar(&o.restoreEvery, "restore-every", o.restoreEvery, "grow: restore every snapshot after every Nth step and after the last (0: no restores)")
	fs.BoolVar(&o.restoreStart, "restore-start", o.restoreStart, "also start a server on each restored data dir and time it until a linearizable read answers")
	fs.BoolVar(&o.updateRestore, "update-restore", o.updateRestore, "update: restore every snapshot of the last step and, if the incremental one is a log version, a files version of the same state")
	fs.Func("strata-flags", "comma-separated extra flags of the strata member, e.g. --backup-log-ratio=0 (files versions only)", listSetter(&o.strataFlags))
	fs.StringVar(&o.render, "render", o.render, "re-render backup.md and the plots (next to it) from this backup.json and exit")
}

// bkSnap is one snapshot.
type bkSnap struct {
	Experiment string `json:"experiment"`
	Step       int    `json:"step"`
	Method     string `json:"method"`
	// Order is the snapshot's place among the step's snapshots (1 first).
	Order int `json:"order"`
	// Keys is the number of live keys; WrittenBytes the key and value bytes
	// the experiment wrote up to this step (its x axis); LiveBytes the key
	// and value bytes of the live keys.
	Keys         int64 `json:"keys"`
	WrittenBytes int64 `json:"written_bytes"`
	LiveBytes    int64 `json:"live_bytes"`
	// Seconds is the wall time of the command, exec to exit.
	Seconds float64 `json:"seconds"`
	// Bytes is what this snapshot added to its storage: the target's growth
	// (incremental) or the file's size (full).
	Bytes int64 `json:"bytes"`
	// FullBytes is the whole snapshot: the file's size (full), the
	// version's size (a files version), or, for a log version, the size a
	// files version of the same state would have (its checkpoint's bytes).
	FullBytes int64 `json:"full_bytes"`
	// CumSeconds and CumBytes sum Seconds and Bytes over the experiment's
	// steps so far (step 0, a base, not counted).
	CumSeconds float64 `json:"cum_seconds"`
	CumBytes   int64   `json:"cum_bytes"`
	// Incremental only: the version, its kind ("files" or "log"), the
	// files version a log version is based on, its file (or log object)
	// count, the bytes of a log version's log objects (replayed by a
	// restore), and the files (objects) and bytes the command said it
	// uploaded.
	Version   uint64 `json:"version,omitempty"`
	Kind      string `json:"kind,omitempty"`
	Base      uint64 `json:"base,omitempty"`
	Files     int    `json:"files,omitempty"`
	LogBytes  int64  `json:"log_bytes,omitempty"`
	NewFiles  int    `json:"new_files,omitempty"`
	NewBytes  int64  `json:"new_bytes,omitempty"`
	LoadAvg   string `json:"loadavg"`
	Err       string `json:"error,omitempty"`
	snapshotF string // full: the file, until the step's restores are done
}

// bkRestore is one restore of one snapshot.
type bkRestore struct {
	Experiment string `json:"experiment"`
	Step       int    `json:"step"`
	Method     string `json:"method"`
	Keys       int64  `json:"keys"`
	LiveBytes  int64  `json:"live_bytes"`
	// SnapshotBytes is the snapshot's whole size (FullBytes).
	SnapshotBytes int64 `json:"snapshot_bytes"`
	// Seconds is the restore command's wall time.
	Seconds float64 `json:"seconds"`
	// StartSeconds is the time from exec of a server on the restored data
	// dir until a linearizable read answered (-restore-start).
	StartSeconds float64 `json:"start_seconds,omitempty"`
	// DataDirBytes is the restored data dir's size (apparent), before the
	// server started.
	DataDirBytes int64  `json:"data_dir_bytes"`
	LoadAvg      string `json:"loadavg"`
	Err          string `json:"error,omitempty"`
}

// bkLoad is one step's writes into one server.
type bkLoad struct {
	Experiment string  `json:"experiment"`
	Step       int     `json:"step"`
	Server     string  `json:"server"`
	Keys       int64   `json:"keys_written"`
	Seconds    float64 `json:"seconds"`
	// DataDirBytes is the server's data dir (and log dir) size, apparent,
	// after the step's snapshots.
	DataDirBytes int64  `json:"data_dir_bytes"`
	Err          string `json:"error,omitempty"`
}

// bkReport is the experiment's output (backup.json).
type bkReport struct {
	Started  time.Time           `json:"started"`
	Command  string              `json:"command"`
	Machine  report.Machine      `json:"machine"`
	Commit   string              `json:"commit"`
	Servers  []report.ServerInfo `json:"servers"`
	Settings bkSettings          `json:"settings"`
	// Commands are the exact snapshot and restore command lines of the
	// first step, one per method and action (ports and paths of this run).
	Commands  map[string][]string `json:"commands"`
	Loads     []bkLoad            `json:"loads"`
	Snapshots []bkSnap            `json:"snapshots"`
	Restores  []bkRestore         `json:"restores,omitempty"`
	// FilesAfterUpdate is the files version taken after the last update
	// step when the incremental snapshot there was a log version
	// (-update-restore): the same state, restored for comparison.
	FilesAfterUpdate *bkSnap   `json:"files_after_update,omitempty"`
	Notes            []string  `json:"notes,omitempty"`
	Finished         time.Time `json:"finished,omitzero"`
}

// bkSettings are the sizes the run used.
type bkSettings struct {
	Experiments   []string `json:"experiments"`
	GrowSteps     int      `json:"grow_steps"`
	GrowKeys      int64    `json:"grow_keys"`
	UpdateSteps   int      `json:"update_steps"`
	UpdatePct     float64  `json:"update_pct"`
	BaseKeys      int64    `json:"base_keys"`
	KeySize       int      `json:"key_size"`
	ValSize       int      `json:"val_size"`
	RestoreEvery  int      `json:"restore_every"`
	RestoreStart  bool     `json:"restore_start"`
	UpdateRestore bool     `json:"update_restore"`
	StrataFlags   []string `json:"strata_flags,omitempty"`
}

func runBackupBench(ctx context.Context, sub string, args []string) error {
	o := defaultBKOptions()
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
		var rep bkReport
		if err := json.Unmarshal(raw, &rep); err != nil {
			return fmt.Errorf("%s: %w", o.render, err)
		}
		files, err := renderBK(&rep, filepath.Dir(o.render))
		for _, f := range files {
			fmt.Println(f)
		}
		return err
	}
	if err := o.check(); err != nil {
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
	_, err = runBK(ctx, o, command, log)
	return err
}

func (o bkOptions) check() error {
	switch {
	case len(o.experiments) == 0:
		return errors.New("-experiments is empty")
	case slices.Contains(o.experiments, expGrow) && (o.growSteps < 1 || o.growKeys < 1):
		return errors.New("-grow-steps and -grow-keys must be at least 1")
	case slices.Contains(o.experiments, expUpdate) && (o.updateSteps < 1 || o.updatePct <= 0 || o.updatePct > 100):
		return errors.New("-update-steps must be at least 1 and -update-pct in (0, 100]")
	case slices.Contains(o.experiments, expUpdate) && !slices.Contains(o.experiments, expGrow) && o.baseKeys < 1:
		return errors.New("-base-keys must be at least 1")
	case o.valSize < 8 || o.restoreEvery < 0:
		return errors.New("-val-size must be at least 8 and -restore-every at least 0")
	}
	return nil
}

// bkRun is one run of the experiment.
type bkRun struct {
	o       bkOptions
	log     *zap.Logger
	rep     *bkReport
	jsonOut string
	work    string // the run's work directory
	target  string // the incremental target's directory
	snaps   string // full snapshot files
	strata  *cluster.Cluster
	etcd    *cluster.Cluster
	etcdctl string
	etcdutl string
	// keys is the number of live keys (0..keys-1 exist); written the key
	// and value bytes written in the current experiment.
	keys    int64
	written int64
	cum     map[string]*bkSnap // method -> last snapshot of the experiment
	// progress is where load progress lines go (nil: quiet).
	progress io.Writer
}

// runBK runs the experiments and writes backup.json, backup.md and the
// plots into o.out after each step; it returns the report (also on error).
func runBK(ctx context.Context, o bkOptions, command string, log *zap.Logger) (*bkReport, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	started := time.Now().UTC()
	work, err := runDirs(&o.repo, &o.binDir, &o.out, o.workDir, "backup", "strata-backup-bench-", started)
	if err != nil {
		return nil, err
	}
	if o.keep {
		log.Info("keeping the work directory", zap.String("dir", work))
	} else {
		defer os.RemoveAll(work)
	}
	r := &bkRun{o: o, log: log, work: work, target: filepath.Join(work, "target"), snaps: filepath.Join(work, "snapshots"),
		jsonOut: filepath.Join(o.out, "backup.json")}
	if !o.quiet {
		r.progress = os.Stderr
	}
	r.rep = &bkReport{Started: started, Command: command, Machine: machineInfo(work), Commit: gitHead(ctx, o.repo),
		Commands: map[string][]string{},
		Settings: bkSettings{Experiments: o.experiments, GrowSteps: o.growSteps, GrowKeys: o.growKeys, UpdateSteps: o.updateSteps,
			UpdatePct: o.updatePct, BaseKeys: o.baseKeys, KeySize: len(load.YCSBKey(0)), ValSize: o.valSize,
			RestoreEvery: o.restoreEvery, RestoreStart: o.restoreStart, UpdateRestore: o.updateRestore, StrataFlags: o.strataFlags}}
	if tmpfs, err := onTmpfs(work); err == nil && tmpfs {
		r.note("the work directory %s is on tmpfs: snapshots and restores never touch a disk", work)
	}
	if err := os.MkdirAll(r.snaps, 0o755); err != nil {
		return r.rep, err
	}
	if err := r.resolveBinaries(ctx); err != nil {
		return r.rep, err
	}
	defer r.stopClusters()
	if err := r.startClusters(ctx); err != nil {
		return r.rep, r.finish(err)
	}
	for _, e := range []string{expGrow, expUpdate} {
		if !slices.Contains(o.experiments, e) {
			continue
		}
		var err error
		if e == expGrow {
			err = r.grow(ctx)
		} else {
			err = r.update(ctx)
		}
		if err != nil {
			return r.rep, r.finish(err)
		}
	}
	return r.rep, r.finish(nil)
}

// finish records the end of the run, writes the report and returns err
// joined with any write error.
func (r *bkRun) finish(err error) error {
	r.rep.Machine.LoadEnd = loadAvg()
	r.rep.Finished = time.Now().UTC()
	if err != nil {
		r.note("run stopped: %v", err)
	}
	return errors.Join(err, r.write())
}

func (r *bkRun) note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.log.Warn(msg)
	r.rep.Notes = append(r.rep.Notes, msg)
}

// write writes backup.json (atomically), backup.md and the plots.
func (r *bkRun) write() error {
	raw, err := json.MarshalIndent(r.rep, "", "  ")
	if err != nil {
		return err
	}
	tmp := r.jsonOut + ".tmp"
	if err := os.WriteFile(tmp, append(raw, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, r.jsonOut); err != nil {
		return err
	}
	_, err = renderBK(r.rep, r.o.out)
	return err
}

// resolveBinaries builds what was not given and records the versions.
func (r *bkRun) resolveBinaries(ctx context.Context) error {
	o := &r.o
	if o.strataBin == "" {
		r.log.Info("building strata", zap.String("bin", o.binDir))
		bin, err := buildStrata(ctx, o.repo, o.binDir)
		if err != nil {
			return err
		}
		o.strataBin = bin
	}
	if o.etcdBin == "" {
		r.log.Info("building etcd, etcdctl and etcdutl from the tools module", zap.String("bin", o.binDir))
		if err := buildEtcdTools(ctx, o.repo, o.binDir); err != nil {
			return err
		}
		o.etcdBin = filepath.Join(o.binDir, "etcd")
	}
	if o.etcdctlBin == "" {
		o.etcdctlBin = filepath.Join(filepath.Dir(o.etcdBin), "etcdctl")
	}
	if o.etcdutlBin == "" {
		o.etcdutlBin = filepath.Join(filepath.Dir(o.etcdBin), "etcdutl")
	}
	r.etcdctl, r.etcdutl = o.etcdctlBin, o.etcdutlBin
	for _, b := range []string{o.strataBin, o.etcdBin, o.etcdctlBin, o.etcdutlBin} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("binary: %w", err)
		}
	}
	version := binaryVersion(ctx, o.strataBin)
	if rev := r.rep.Commit; rev != "" {
		version = "strata at commit " + rev + " (" + version + ")"
	}
	r.rep.Servers = append(r.rep.Servers, report.ServerInfo{Name: "strata", Binary: o.strataBin, Version: version})
	if o.etcd {
		r.rep.Servers = append(r.rep.Servers, report.ServerInfo{Name: "etcd", Binary: o.etcdBin, Version: binaryVersion(ctx, o.etcdBin)})
	}
	r.rep.Servers = append(r.rep.Servers,
		report.ServerInfo{Name: "etcdctl", Binary: o.etcdctlBin, Version: toolVersion(ctx, o.etcdctlBin)},
		report.ServerInfo{Name: "etcdutl", Binary: o.etcdutlBin, Version: toolVersion(ctx, o.etcdutlBin)})
	return nil
}

// toolVersion is the first line of etcdctl's or etcdutl's `version`.
func toolVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "version").Output()
	if err != nil {
		return "no version"
	}
	return strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
}

// startClusters starts one strata member and, with -etcd, one etcd member.
func (r *bkRun) startClusters(ctx context.Context) error {
	var err error
	r.strata, err = cluster.Start(ctx, cluster.Spec{Name: "strata", Kind: cluster.KindStrata, Binary: r.o.strataBin, ExtraArgs: r.o.strataFlags},
		filepath.Join(r.work, "strata"), r.log)
	if err != nil {
		return err
	}
	r.rep.Servers[0].Command = r.strata.Args()
	if r.o.etcd {
		r.etcd, err = cluster.Start(ctx, cluster.Spec{Name: "etcd", Kind: cluster.KindEtcd, Binary: r.o.etcdBin},
			filepath.Join(r.work, "etcd"), r.log)
		if err != nil {
			return err
		}
		r.rep.Servers[1].Command = r.etcd.Args()
	}
	return nil
}

func (r *bkRun) stopClusters() {
	for _, c := range []*cluster.Cluster{r.strata, r.etcd} {
		if c != nil {
			_ = c.Stop()
		}
	}
}

// servers returns the running clusters, strata first.
func (r *bkRun) servers() []*cluster.Cluster {
	cs := []*cluster.Cluster{r.strata}
	if r.etcd != nil {
		cs = append(cs, r.etcd)
	}
	return cs
}

// methods returns the snapshot methods measured.
func (r *bkRun) methods() []string {
	ms := []string{methodIncremental, methodStrataFull}
	if r.etcd != nil {
		ms = append(ms, methodEtcdFull)
	}
	return ms
}

// rotate returns xs rotated left by n: the order of a step's
// measurements changes from step to step, so no method always goes first.
func rotate[T any](xs []T, n int) []T {
	if len(xs) == 0 {
		return xs
	}
	n %= len(xs)
	return append(slices.Clone(xs[n:]), xs[:n]...)
}

// grow runs experiment (a): steps of new keys, snapshots after each.
func (r *bkRun) grow(ctx context.Context) error {
	r.written, r.cum = 0, map[string]*bkSnap{}
	for step := 1; step <= r.o.growSteps; step++ {
		lo, n := r.keys, r.o.growKeys
		if err := r.loadStep(ctx, expGrow, step, n, func(i int64) int64 { return lo + i }, 0); err != nil {
			return err
		}
		r.keys += n
		snaps, err := r.snapshotStep(ctx, expGrow, step)
		if err != nil {
			return err
		}
		if r.o.restoreEvery > 0 && (step%r.o.restoreEvery == 0 || step == r.o.growSteps) {
			if err := r.restoreStep(ctx, expGrow, step, snaps); err != nil {
				return err
			}
		}
		r.dropSnapshots(snaps)
		if err := r.write(); err != nil {
			return err
		}
	}
	return nil
}

// update runs experiment (b): overwrite updatePct percent of the keys per
// step, snapshots after each.
func (r *bkRun) update(ctx context.Context) error {
	r.written, r.cum = 0, map[string]*bkSnap{}
	if r.keys == 0 {
		// No grow before: load the large state at once, step 0, and take
		// the base snapshots (the incremental target needs its first
		// version; step 0 is not counted in the cumulative figures).
		n := r.o.baseKeys
		if err := r.loadStep(ctx, expUpdate, 0, n, func(i int64) int64 { return i }, 0); err != nil {
			return err
		}
		r.keys = n
		snaps, err := r.snapshotStep(ctx, expUpdate, 0)
		if err != nil {
			return err
		}
		r.dropSnapshots(snaps)
		r.written, r.cum = 0, map[string]*bkSnap{}
	}
	k := max(int64(float64(r.keys)*r.o.updatePct/100+0.5), 1)
	for step := 1; step <= r.o.updateSteps; step++ {
		rng := rand.New(rand.NewPCG(r.o.seed, uint64(step)))
		perm := rng.Perm(int(r.keys))[:k]
		if err := r.loadStep(ctx, expUpdate, step, k, func(i int64) int64 { return int64(perm[i]) }, step); err != nil {
			return err
		}
		snaps, err := r.snapshotStep(ctx, expUpdate, step)
		if err != nil {
			return err
		}
		if step == r.o.updateSteps && r.o.updateRestore {
			if err := r.restoreStep(ctx, expUpdate, step, snaps); err != nil {
				return err
			}
			if err := r.filesAfterUpdate(ctx, step, snaps); err != nil {
				return err
			}
		}
		r.dropSnapshots(snaps)
		if err := r.write(); err != nil {
			return err
		}
	}
	return nil
}

// filesAfterUpdate takes and restores a files version of the state of the
// last update step, if that step's incremental snapshot was a log version:
// the same state restored both ways (report: FilesAfterUpdate).
func (r *bkRun) filesAfterUpdate(ctx context.Context, step int, snaps []*bkSnap) error {
	var inc *bkSnap
	for _, s := range snaps {
		if s.Method == methodIncremental && s.Kind == "log" {
			inc = s
		}
	}
	if inc == nil {
		return nil
	}
	f := &bkSnap{Experiment: expUpdate, Step: step, Method: methodIncremental, Keys: inc.Keys, WrittenBytes: inc.WrittenBytes,
		LiveBytes: inc.LiveBytes, LoadAvg: loadAvg()}
	r.rep.FilesAfterUpdate = f
	if err := r.incremental(ctx, f, "--kind=files"); err != nil {
		f.Err = err.Error()
		return fmt.Errorf("update step %d: a files version: %w", step, err)
	}
	res := bkRestore{Experiment: expUpdate + "-files", Step: step, Method: methodIncremental, Keys: f.Keys, LiveBytes: f.LiveBytes,
		SnapshotBytes: f.FullBytes, LoadAvg: loadAvg()}
	err := r.restoreOne(ctx, f, &res)
	if err != nil {
		res.Err = err.Error()
	}
	r.rep.Restores = append(r.rep.Restores, res)
	if err != nil {
		return fmt.Errorf("update step %d: restore the files version: %w", step, err)
	}
	r.log.Info("restore of a files version of the same state", zap.Int("step", step), zap.Float64("seconds", res.Seconds))
	return nil
}

// loadStep writes n keys, key(i) for i in [0, n), generation gen of their
// values, into every server, alternating which goes first by step.
func (r *bkRun) loadStep(ctx context.Context, exp string, step int, n int64, key func(int64) int64, gen int) error {
	for _, c := range rotate(r.servers(), step) {
		t0 := time.Now()
		err := bkPut(ctx, c.Endpoints(), n, key, gen, r.o.seed, r.o.valSize, r.progress, fmt.Sprintf("%s %s step %d", c.Spec().Name, exp, step))
		l := bkLoad{Experiment: exp, Step: step, Server: c.Spec().Name, Keys: n, Seconds: time.Since(t0).Seconds()}
		if err != nil {
			l.Err = err.Error()
		}
		r.rep.Loads = append(r.rep.Loads, l)
		if err != nil {
			return fmt.Errorf("%s %s step %d: %w", c.Spec().Name, exp, step, err)
		}
	}
	r.written += n * int64(len(load.YCSBKey(0))+r.o.valSize)
	return nil
}

// bkBatch is the number of puts per load transaction (etcd's default
// --max-txn-ops is 128); bkWorkers the transactions in flight.
const (
	bkBatch   = 100
	bkWorkers = 16
)

// bkPut writes keys YCSBKey(key(i)), i in [0, n), with bkValue values of
// generation gen, in transactions of bkBatch puts.
func bkPut(ctx context.Context, endpoints []string, n int64, key func(int64) int64, gen int, seed uint64, valSize int,
	progress io.Writer, label string) error {
	cli, err := cluster.NewClient(endpoints)
	if err != nil {
		return err
	}
	defer cli.Close()
	prog := load.StartProgress(progress, label, n)
	defer prog.Stop()
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range bkWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := next.Add(bkBatch) - bkBatch
				if lo >= n || ctx.Err() != nil {
					return
				}
				hi := min(lo+bkBatch, n)
				ops := make([]clientv3.Op, 0, hi-lo)
				for i := lo; i < hi; i++ {
					k := key(i)
					ops = append(ops, clientv3.OpPut(load.YCSBKey(k), string(bkValue(seed, k, gen, valSize))))
				}
				tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
				_, err := cli.Txn(tctx).Then(ops...).Commit()
				cancel()
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("put keys %d..%d of %d: %w", lo, hi-1, n, err))
					mu.Unlock()
					return
				}
				prog.Add(hi - lo)
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// bkValue is the value of key k at generation gen: n random bytes,
// deterministic, incompressible (Pebble compresses its blocks, bbolt does
// not: random values keep the comparison about the data, not its entropy).
func bkValue(seed uint64, k int64, gen int, n int) []byte {
	rng := rand.New(rand.NewPCG(seed^uint64(k)*0x9e3779b97f4a7c15, uint64(gen)))
	b := make([]byte, (n+7)&^7)
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	return b[:n]
}

// snapshotStep takes one snapshot of every method, in an order that
// rotates by step, and records them.
func (r *bkRun) snapshotStep(ctx context.Context, exp string, step int) ([]*bkSnap, error) {
	var out []*bkSnap
	for i, m := range rotate(r.methods(), step) {
		s := &bkSnap{Experiment: exp, Step: step, Method: m, Order: i + 1, Keys: r.keys, WrittenBytes: r.written,
			LiveBytes: r.keys * int64(len(load.YCSBKey(0))+r.o.valSize), LoadAvg: loadAvg()}
		var err error
		if m == methodIncremental {
			err = r.incremental(ctx, s)
		} else {
			err = r.full(ctx, s)
		}
		if err != nil {
			s.Err = err.Error()
		}
		if step > 0 {
			if prev := r.cum[m]; prev != nil {
				s.CumSeconds, s.CumBytes = prev.CumSeconds, prev.CumBytes
			}
			s.CumSeconds += s.Seconds
			s.CumBytes += s.Bytes
			r.cum[m] = s
		}
		r.rep.Snapshots = append(r.rep.Snapshots, *s)
		if err != nil {
			return out, fmt.Errorf("%s step %d %s: %w", exp, step, m, err)
		}
		r.log.Info("snapshot", zap.String("experiment", exp), zap.Int("step", step), zap.String("method", m),
			zap.Float64("seconds", s.Seconds), zap.Int64("bytes", s.Bytes), zap.Int64("full bytes", s.FullBytes))
		out = append(out, s)
	}
	for _, c := range r.servers() {
		_, apparent, err := c.DataSize()
		if err != nil {
			return out, err
		}
		for i := len(r.rep.Loads) - 1; i >= 0; i-- {
			l := &r.rep.Loads[i]
			if l.Experiment == exp && l.Step == step && l.Server == c.Spec().Name {
				l.DataDirBytes = apparent
				break
			}
		}
	}
	return out, nil
}

// createResult is the result object `strata backup create --endpoints
// --json` prints (cmd/strata/backup.go).
type createResult struct {
	Event       string `json:"event"`
	Version     uint64 `json:"version"`
	Kind        string `json:"kind"`
	Base        uint64 `json:"base"`
	Files       int    `json:"files"`
	Size        int64  `json:"size"`
	NewFiles    int    `json:"new_files"`
	NewBytes    int64  `json:"new_bytes"`
	EngineBytes int64  `json:"engine_bytes"`
}

// incremental takes a version with `strata backup create`, with extra
// flags (--kind).
func (r *bkRun) incremental(ctx context.Context, s *bkSnap, extra ...string) error {
	_, before, err := treeSize(r.target)
	if err != nil {
		return err
	}
	args := append([]string{r.o.strataBin, "backup", "create", "--endpoints=" + r.strata.Endpoints()[0], "--target=file://" + r.target, "--json"}, extra...)
	out, d, err := r.timed(ctx, "create "+methodIncremental+strings.Join(extra, " "), args)
	if err != nil {
		return err
	}
	s.Seconds = d.Seconds()
	_, after, err := treeSize(r.target)
	if err != nil {
		return err
	}
	s.Bytes = after - before
	var res createResult
	if err := json.Unmarshal(bytes.TrimSpace(out), &res); err != nil || res.Event != "result" || res.Version == 0 {
		return fmt.Errorf("strata backup create --json printed %q, not a result object (%v)", out, err)
	}
	s.Version, s.Kind, s.Files, s.NewFiles, s.NewBytes = res.Version, res.Kind, res.Files, res.NewFiles, res.NewBytes
	s.FullBytes = res.Size
	if res.Kind == "log" {
		s.Base, s.LogBytes, s.FullBytes = res.Base, res.Size, res.EngineBytes
	}
	return nil
}

// full saves a snapshot with `etcdctl snapshot save`.
func (r *bkRun) full(ctx context.Context, s *bkSnap) error {
	c := r.strata
	if s.Method == methodEtcdFull {
		c = r.etcd
	}
	file := filepath.Join(r.snaps, fmt.Sprintf("%s-%s-%d.db", s.Method, s.Experiment, s.Step))
	args := []string{r.etcdctl, "--endpoints=" + c.Endpoints()[0], "--dial-timeout=10s", "--command-timeout=1h", "snapshot", "save", file}
	_, d, err := r.timed(ctx, "create "+s.Method, args)
	if err != nil {
		return err
	}
	s.Seconds = d.Seconds()
	st, err := os.Stat(file)
	if err != nil {
		return err
	}
	s.Bytes, s.FullBytes, s.snapshotF = st.Size(), st.Size(), file
	return nil
}

// timed runs args, records the first command line of each action in the
// report, and returns its stdout and wall time.
func (r *bkRun) timed(ctx context.Context, action string, args []string) ([]byte, time.Duration, error) {
	if _, ok := r.rep.Commands[action]; !ok {
		r.rep.Commands[action] = args
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	if err != nil {
		return nil, d, fmt.Errorf("%s: %w: %s%s", strings.Join(args, " "), err, strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), d, nil
}

// dropSnapshots removes the step's full snapshot files (their sizes are
// recorded), unless -keep, which keeps every one (as much disk as the full
// snapshots' cumulative bytes).
func (r *bkRun) dropSnapshots(snaps []*bkSnap) {
	if r.o.keep {
		return
	}
	for _, s := range snaps {
		if s.snapshotF != "" {
			_ = os.Remove(s.snapshotF)
		}
	}
}

// restoreToken is the new cluster's token in every restore.
const restoreToken = "strata-backup-bench-restore"

// restoreStep restores every snapshot of the step, in a rotating order.
func (r *bkRun) restoreStep(ctx context.Context, exp string, step int, snaps []*bkSnap) error {
	for _, s := range rotate(snaps, step) {
		res := bkRestore{Experiment: exp, Step: step, Method: s.Method, Keys: s.Keys, LiveBytes: s.LiveBytes, SnapshotBytes: s.FullBytes, LoadAvg: loadAvg()}
		err := r.restoreOne(ctx, s, &res)
		if err != nil {
			res.Err = err.Error()
		}
		r.rep.Restores = append(r.rep.Restores, res)
		if err != nil {
			return fmt.Errorf("%s step %d restore %s: %w", exp, step, s.Method, err)
		}
		r.log.Info("restore", zap.String("experiment", exp), zap.Int("step", step), zap.String("method", s.Method),
			zap.Float64("seconds", res.Seconds), zap.Float64("start seconds", res.StartSeconds))
	}
	return nil
}

// restoreOne restores s into a new data dir, optionally starts a server on
// it, checks the key count, and removes the data dir.
func (r *bkRun) restoreOne(ctx context.Context, s *bkSnap, res *bkRestore) error {
	ports, err := twoFreePorts()
	if err != nil {
		return err
	}
	peer, client := fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	dir := filepath.Join(r.work, "restore-"+s.Method)
	_ = os.RemoveAll(dir)
	defer os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dataDir := filepath.Join(dir, "data")
	const name = "r0"
	cflags := []string{"--data-dir=" + dataDir, "--name=" + name, "--initial-cluster=" + name + "=" + peer,
		"--initial-advertise-peer-urls=" + peer, "--initial-cluster-token=" + restoreToken}
	// A strata member on another engine (-strata-flags=--engine=NAME)
	// restores onto that engine and starts with it, as an operator would
	// (a data dir is refused with another --engine than its own).
	var engineFlag []string
	for _, f := range r.o.strataFlags {
		if strings.HasPrefix(f, "--engine=") {
			engineFlag = []string{f}
		}
	}
	var args []string
	server := r.o.strataBin
	if s.Method != methodEtcdFull {
		cflags = append(cflags, engineFlag...)
	}
	switch s.Method {
	case methodIncremental:
		args = append([]string{r.o.strataBin, "restore", "--from=file://" + r.target, fmt.Sprintf("--version=%d", s.Version)}, cflags...)
	case methodStrataFull:
		args = append(append([]string{r.o.strataBin, "restore"}, cflags...), s.snapshotF)
	case methodEtcdFull:
		args = append([]string{r.etcdutl, "snapshot", "restore", s.snapshotF}, cflags...)
		server = r.o.etcdBin
	}
	_, d, err := r.timed(ctx, "restore "+s.Method, args)
	if err != nil {
		return err
	}
	res.Seconds = d.Seconds()
	if _, res.DataDirBytes, err = treeSize(dataDir); err != nil {
		return err
	}
	if !r.o.restoreStart {
		return nil
	}
	sargs := append(slices.Clone(cflags), "--listen-peer-urls="+peer, "--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--initial-cluster-state=new", "--log-level=warn", "--quota-backend-bytes=8589934592")
	if _, ok := r.rep.Commands["start "+s.Method]; !ok {
		r.rep.Commands["start "+s.Method] = append([]string{server}, sargs...)
	}
	start, err := startRestored(ctx, server, sargs, client, filepath.Join(dir, "server.log"))
	if start.proc != nil {
		defer start.stop()
	}
	if err != nil {
		return err
	}
	res.StartSeconds = start.ready.Seconds()
	return checkCount(ctx, client, s.Keys)
}

// restoredServer is a server started on a restored data dir, tracked by PID.
type restoredServer struct {
	proc  *os.Process
	done  chan struct{}
	ready time.Duration
}

// startRestored starts bin with args and waits until a linearizable read on
// client answers; ready is the time from exec.
func startRestored(ctx context.Context, bin string, args []string, client, logPath string) (restoredServer, error) {
	var s restoredServer
	logf, err := os.Create(logPath)
	if err != nil {
		return s, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return s, fmt.Errorf("start %s: %w", bin, err)
	}
	s.proc, s.done = cmd.Process, make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(s.done) }()
	cli, err := cluster.NewClient([]string{client})
	if err != nil {
		return s, err
	}
	defer cli.Close()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		select {
		case <-s.done:
			return s, fmt.Errorf("%s exited on the restored data dir; see %s", bin, logPath)
		default:
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Get(rctx, "strata-bench-ready")
		cancel()
		if err == nil {
			s.ready = time.Since(t0)
			return s, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return s, fmt.Errorf("%s on the restored data dir not ready: %v; see %s", bin, err, logPath)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stop ends the server with SIGTERM (SIGKILL after 20 s) and waits.
func (s restoredServer) stop() {
	_ = s.proc.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		_ = s.proc.Kill()
		<-s.done
	}
}

// checkCount fails unless the server at client holds exactly want keys.
func checkCount(ctx context.Context, client string, want int64) error {
	cli, err := cluster.NewClient([]string{client})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	resp, err := cli.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("count keys: %w", err)
	}
	if resp.Count != want {
		return fmt.Errorf("restored %d keys, want %d", resp.Count, want)
	}
	return nil
}
