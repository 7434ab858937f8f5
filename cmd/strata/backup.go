package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/member"
)

const backupUsage = `usage:
  strata backup create --data-dir DIR --target URL   back up a stopped member's engine (a new version)
  strata backup create --endpoints URL [--target URL] [--kind files|log] [--user NAME[:PASSWORD]] [--cacert F --cert F --key F]
                                                     ask a running member for a version (default target:
                                                     its --backup-target; it uses its own --s3-* settings;
                                                     a files or a log version as its policy says, or --kind)
  strata backup list   --target URL [--json]         the versions, oldest first
  strata backup verify --target URL [--version N]    check every file of a version (default the latest)
                                                     and every archived raft log object
  strata backup prune  --target URL [--keep-last N] [--keep-within D] [--keep-exponential]
                                                     delete other versions, then the files none kept names
  strata restore --from URL [--version N | --to-revision R | --to-time T] --data-dir NEW ...
                                                     build a data dir from a version, or the state at a
                                                     revision or at a time (RFC 3339)

URL is file:///dir or s3://bucket/prefix. For s3, --s3-endpoint, --s3-region and the
credentials default to AWS_ENDPOINT_URL, AWS_REGION and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY.`

// runBackup is `strata backup`: incremental backups of engine files to a
// target (package backup, backup/FORMAT.md).
func runBackup(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, backupUsage)
		return 2
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("strata backup "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var tf targetFlags
	tf.register(fs)
	var online onlineFlags
	if cmd == "create" {
		online.register(fs)
	}
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintf(stderr, "strata backup %s: %v\n", cmd, err)
		return 1
	}
	parse := func() int {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		if fs.NArg() != 0 {
			fmt.Fprintf(stderr, "strata backup %s: unexpected arguments %q\n", cmd, fs.Args())
			return 2
		}
		if tf.url == "" && online.endpoints == "" {
			fmt.Fprintf(stderr, "strata backup %s: --target is required\n", cmd)
			return 2
		}
		return -1
	}
	switch cmd {
	case "create":
		dataDir := fs.String("data-dir", "", "The data directory of a stopped member.")
		kind := fs.String("kind", "", "With --endpoints: files (the engine's files) or log (the raft log since the target's last version, on its files version); default: as the member's --backup-log-ratio and --backup-full-every say.")
		asJSON := fs.Bool("json", false, "Print JSON lines on stdout for scripts: progress events, then the result (or an error) object.")
		if code := parse(); code >= 0 {
			return code
		}
		progress := newProgress("backup create", *asJSON, stdout, stderr)
		if online.endpoints != "" {
			if *dataDir != "" {
				fmt.Fprintln(stderr, "strata backup create: give --data-dir (a stopped member) or --endpoints (a running one), not both")
				return 2
			}
			if k := backup.Kind(*kind); k != "" && k != backup.KindFiles && k != backup.KindLog {
				fmt.Fprintf(stderr, "strata backup create: --kind %q: want files or log\n", *kind)
				return 2
			}
			// The member does the work: no progress, only the result.
			resp, err := online.create(ctx, tf.url, backup.Kind(*kind))
			if err != nil {
				progress.fail(err)
				return fail(err)
			}
			if *asJSON {
				fields := map[string]any{"version": resp.Version, "kind": resp.Kind, "target": resp.Target, "member_id": fmt.Sprintf("%x", resp.MemberID),
					"raft_index": resp.RaftIndex, "raft_term": resp.RaftTerm, "revision": resp.Revision, "files": resp.Files, "size": resp.Size,
					"new_files": resp.NewFiles, "new_bytes": resp.NewBytes, "duration_seconds": resp.Duration.Seconds()}
				if resp.Kind == backup.KindLog {
					fields["base"], fields["engine_bytes"] = resp.Base, resp.EngineBytes
				}
				progress.result(fields)
				return 0
			}
			if resp.Kind == backup.KindLog {
				fmt.Fprintf(stdout, "version %d of %s by member %x: a log version on version %d: raft index %d, term %d, revision %d, %d log objects (%d bytes; the engine holds %d), uploaded %d log objects (%d bytes) in %s\n",
					resp.Version, resp.Target, resp.MemberID, resp.Base, resp.RaftIndex, resp.RaftTerm, resp.Revision, resp.Files, resp.Size, resp.EngineBytes,
					resp.NewFiles, resp.NewBytes, resp.Duration.Round(time.Millisecond))
				return 0
			}
			fmt.Fprintf(stdout, "version %d of %s by member %x: raft index %d, term %d, revision %d, %d files (%d bytes), uploaded %d files (%d bytes) in %s\n",
				resp.Version, resp.Target, resp.MemberID, resp.RaftIndex, resp.RaftTerm, resp.Revision, resp.Files, resp.Size, resp.NewFiles,
				resp.NewBytes, resp.Duration.Round(time.Millisecond))
			return 0
		}
		if *kind == string(backup.KindLog) {
			fmt.Fprintln(stderr, "strata backup create: --kind log needs --endpoints: a stopped member's versions are files versions (its log is not read)")
			return 2
		}
		if *dataDir == "" {
			fmt.Fprintln(stderr, "strata backup create: --data-dir (a stopped member) or --endpoints (a running one) is required")
			return 2
		}
		t, err := tf.open(ctx)
		if err != nil {
			progress.fail(err)
			return fail(err)
		}
		start := time.Now()
		m, err := backup.CreateOffline(ctx, *dataDir, t, nil, progress)
		if err != nil {
			progress.fail(err)
			return fail(err)
		}
		progress.result(map[string]any{"version": m.Version, "target": t.String(), "raft_index": m.RaftIndex, "raft_term": m.RaftTerm,
			"revision": m.Revision, "files": len(m.Files), "size": m.Size(), "new_files": m.NewFiles, "new_bytes": m.NewBytes,
			"duration_seconds": time.Since(start).Seconds()})
		if *asJSON {
			return 0
		}
		fmt.Fprintf(stdout, "version %d of %s: raft index %d, term %d, revision %d, %d files (%d bytes), uploaded %d files (%d bytes) in %s\n",
			m.Version, t, m.RaftIndex, m.RaftTerm, m.Revision, len(m.Files), m.Size(), m.NewFiles, m.NewBytes, time.Since(start).Round(time.Millisecond))
		return 0
	case "list":
		asJSON := fs.Bool("json", false, "Print JSON, an array of manifests, for scripts.")
		if code := parse(); code >= 0 {
			return code
		}
		t, err := tf.openExisting(ctx)
		if err != nil {
			return fail(err)
		}
		list, err := backup.List(ctx, t)
		if err != nil {
			return fail(err)
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if list == nil {
				list = []*backup.Manifest{}
			}
			if err := enc.Encode(list); err != nil {
				return fail(err)
			}
			return 0
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		// FILES and SIZE are what the version names: engine files, or a
		// log version's log objects (its base is another line).
		fmt.Fprintln(tw, "VERSION\tKIND\tBASE\tCREATED\tINDEX\tTERM\tREVISION\tCOMPACT-REVISION\tFILES\tSIZE\tNEW-FILES\tNEW-BYTES")
		for _, m := range list {
			base, files, size := "-", len(m.Files), m.Size()
			if m.IsLog() {
				base, files, size = fmt.Sprint(m.Base), len(m.Log), m.LogSize()
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", m.Version, m.Kind, base, m.Created.Format(time.RFC3339), m.RaftIndex, m.RaftTerm,
				m.Revision, m.CompactRevision, files, size, m.NewFiles, m.NewBytes)
		}
		if err := tw.Flush(); err != nil {
			return fail(err)
		}
		logs, err := backup.ArchivedLog(ctx, t)
		if err != nil {
			return fail(err)
		}
		if len(logs) > 0 {
			runs, err := backup.ArchivedRuns(ctx, t)
			if err != nil {
				return fail(err)
			}
			fmt.Fprintf(stdout, "archived raft log (point-in-time restore): entries %s in %d objects\n", logRuns(runs), len(logs))
		}
		return 0
	case "verify":
		version := fs.Uint64("version", 0, "The version to verify (0: the latest).")
		if code := parse(); code >= 0 {
			return code
		}
		t, err := tf.openExisting(ctx)
		if err != nil {
			return fail(err)
		}
		rep, err := backup.Verify(ctx, t, *version)
		if err != nil {
			for _, b := range rep.Bad {
				fmt.Fprintf(stdout, "bad: %s\n", b)
			}
			return fail(err)
		}
		if rep.Base != 0 {
			fmt.Fprintf(stdout, "version %d of %s, a log version on version %d: %d files of the base and %d log objects (%d bytes) match their sha256\n",
				rep.Version, t, rep.Base, rep.Files, rep.LogObjects, rep.Bytes)
		} else {
			fmt.Fprintf(stdout, "version %d of %s: %d files (%d bytes) match their sha256\n", rep.Version, t, rep.Files, rep.Bytes)
		}
		lrep, err := backup.VerifyLog(ctx, t)
		if err != nil {
			for _, b := range lrep.Bad {
				fmt.Fprintf(stdout, "bad: %s\n", b)
			}
			return fail(err)
		}
		if lrep.Objects > 0 {
			fmt.Fprintf(stdout, "archived raft log: %d objects (%d entries) match their sha256\n", lrep.Objects, lrep.Entries)
		}
		return 0
	case "prune":
		keepLast := fs.Int("keep-last", 0, "Keep the newest N versions.")
		keepWithin := fs.Duration("keep-within", 0, "Keep the versions created within this duration (e.g. 168h). The newest version is always kept.")
		keepExp := fs.Bool("keep-exponential", false, "Keep the newest version of every hour for 24 h, of every day for 7 days and of every week for 4 weeks (UTC), like etcd-backup-restore's Exponential policy.")
		if code := parse(); code >= 0 {
			return code
		}
		t, err := tf.openExisting(ctx)
		if err != nil {
			return fail(err)
		}
		rep, err := backup.Prune(ctx, t, backup.Retention{KeepLast: *keepLast, KeepWithin: *keepWithin, Exponential: *keepExp})
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "kept versions %v, deleted versions %v, deleted %d files (%d bytes)\n", rep.Kept, rep.Deleted, rep.FilesDeleted, rep.BytesFreed)
		return 0
	default:
		fmt.Fprintf(stderr, "strata backup: unknown command %q\n%s\n", cmd, backupUsage)
		return 2
	}
}

// targetFlags name a backup target and how to reach it.
type targetFlags struct {
	url  string
	opts backup.TargetOptions
}

func (f *targetFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "target", "", "The backup target: file:///dir or s3://bucket/prefix.")
	f.registerS3(fs)
}

// registerS3 registers the --s3-* flags, which `strata backup`, `strata
// restore --from` and the member (memberBackupFlags) share.
func (f *targetFlags) registerS3(fs *flag.FlagSet) {
	fs.StringVar(&f.opts.Endpoint, "s3-endpoint", "", "S3 endpoint, host:port or http(s)://host:port (default AWS_ENDPOINT_URL, else s3.amazonaws.com).")
	fs.StringVar(&f.opts.Region, "s3-region", "", "S3 region (default AWS_REGION).")
	fs.StringVar(&f.opts.AccessKey, "s3-access-key", "", "S3 access key (default AWS_ACCESS_KEY_ID).")
	fs.StringVar(&f.opts.SecretKey, "s3-secret-key", "", "S3 secret key (default AWS_SECRET_ACCESS_KEY; prefer the variable: a flag shows in the process list).")
	fs.BoolVar(&f.opts.Insecure, "s3-insecure", false, "Use http for an --s3-endpoint given without a scheme.")
}

// open opens the target to write versions to: a file:// directory is
// created if missing.
func (f *targetFlags) open(ctx context.Context) (backup.Target, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return backup.OpenTarget(ctx, f.url, f.opts)
}

// openExisting opens the target to read (or prune) what it holds: a
// file:// directory that does not exist is refused, not created.
func (f *targetFlags) openExisting(ctx context.Context) (backup.Target, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	opts := f.opts
	opts.MustExist = true
	return backup.OpenTarget(ctx, f.url, opts)
}

// restoreFromTarget is `strata restore --from URL`: a version of an
// incremental backup into a new data directory.
func restoreFromTarget(tf *targetFlags, version uint64, cfg backup.RestoreConfig, asJSON bool, stdout, stderr io.Writer) int {
	ctx := context.Background()
	progress := newProgress("restore", asJSON, stdout, stderr)
	fail := func(err error) int {
		progress.fail(err)
		fmt.Fprintf(stderr, "strata restore: %v\n", err)
		return 1
	}
	t, err := tf.openExisting(ctx)
	if err != nil {
		return fail(err)
	}
	cfg.Version = version
	cfg.Progress = progress
	start := time.Now()
	res, err := backup.Restore(ctx, t, cfg)
	if err != nil {
		return fail(err)
	}
	m := res.Manifest
	fields := map[string]any{"version": m.Version, "kind": m.Kind, "target": t.String(), "raft_index": m.RaftIndex, "revision": m.Revision,
		"records": res.Records, "data_dir": cfg.DataDir, "member_id": fmt.Sprintf("%x", res.MemberID), "cluster_id": fmt.Sprintf("%x", res.ClusterID),
		"duration_seconds": time.Since(start).Seconds()}
	if res.ReplayedTo != 0 {
		fields["replayed_to"] = res.ReplayedTo
	}
	if m.IsLog() {
		fields["base"] = m.Base
	}
	if cfg.ToRevision != 0 {
		fields["to_revision"] = cfg.ToRevision
	}
	if cfg.ToIndex != 0 {
		fields["to_index"] = cfg.ToIndex
	}
	if res.ReplayedTo != 0 {
		fields["source"] = res.Source
	}
	if !cfg.ToTime.IsZero() {
		fields["to_time"], fields["state_time"] = cfg.ToTime.UTC(), res.StateTime
	}
	progress.result(fields)
	if asJSON {
		return 0
	}
	if !cfg.ToTime.IsZero() {
		to := fmt.Sprintf("version %d of %s at raft index %d, revision %d", m.Version, t, m.RaftIndex, m.Revision)
		if res.ReplayedTo != 0 {
			to += fmt.Sprintf(", then its archived log to index %d", res.ReplayedTo) // a time is found in the archive only
		}
		fmt.Fprintf(stdout, "restored the state at %s, as of %s, the last time sample at or before it (%s; %d records) into %s: member %x of cluster %x\n",
			cfg.ToTime.UTC().Format(time.RFC3339Nano), res.StateTime.Format(time.RFC3339Nano), to, res.Records, cfg.DataDir, res.MemberID, res.ClusterID)
		return 0
	}
	if res.ReplayedTo != 0 {
		what := fmt.Sprintf("revision %d", cfg.ToRevision)
		if cfg.ToIndex != 0 {
			what = fmt.Sprintf("index %d", cfg.ToIndex)
		}
		fmt.Fprintf(stdout, "restored %s (version %d of %s at raft index %d, revision %d, then %s to index %d; %d records) into %s: member %x of cluster %x\n",
			what, m.Version, t, m.RaftIndex, m.Revision, res.Source, res.ReplayedTo, res.Records, cfg.DataDir, res.MemberID, res.ClusterID)
		return 0
	}
	if m.IsLog() {
		fmt.Fprintf(stdout, "restored version %d of %s (a log version: version %d, then its log to raft index %d, revision %d; %d records) into %s: member %x of cluster %x\n",
			m.Version, t, m.Base, m.RaftIndex, m.Revision, res.Records, cfg.DataDir, res.MemberID, res.ClusterID)
		return 0
	}
	fmt.Fprintf(stdout, "restored version %d of %s (raft index %d, revision %d, %d records) into %s: member %x of cluster %x\n",
		m.Version, t, m.RaftIndex, m.Revision, res.Records, cfg.DataDir, res.MemberID, res.ClusterID)
	return 0
}

// memberBackupFlags are a member's backup flags: its own target, the
// continuous mode and its retention, and the --s3-* flags the CLI has.
type memberBackupFlags struct {
	target      targetFlags
	interval    time.Duration
	logInterval time.Duration
	keepLast    int
	keepWithin  time.Duration
	keepExp     bool
	logRatio    float64
	fullEvery   int
}

func (f *memberBackupFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.target.url, "backup-target", "", "strata: the member's backup target, file:///dir or s3://bucket/prefix (docs/backup.md). Also the default target of `strata backup create --endpoints`.")
	fs.DurationVar(&f.interval, "backup-interval", 0, "strata: take a version of the engine into --backup-target this often, on the leader only (0: off).")
	fs.DurationVar(&f.logInterval, "backup-log-interval", 0, "strata: also archive the applied raft log into --backup-target this often between versions, for point-in-time restore (0: only right after each version). Keep it well under the time the member takes to apply --snapshot-count entries.")
	fs.IntVar(&f.keepLast, "backup-keep-last", 0, "strata: after each version of --backup-interval, prune the target to the newest N versions (0: no such rule).")
	fs.DurationVar(&f.keepWithin, "backup-keep-within", 0, "strata: after each version of --backup-interval, keep the versions created within this duration (0: no such rule). The newest is always kept.")
	fs.BoolVar(&f.keepExp, "backup-keep-exponential", false, "strata: after each version of --backup-interval, keep the newest version of every hour for 24 h, of every day for 7 days and of every week for 4 weeks (UTC), as `strata backup prune --keep-exponential`.")
	fs.Float64Var(&f.logRatio, "backup-log-ratio", defaultLogRatio, "strata: a version is a log version (the raft log since the target's last version, on its last files version) while that log, replayed from the files version, stays at most this fraction of the files version's bytes, and the member's log still holds it; else a files version (0: files versions only). Bounds what a restore replays (docs/backup.md, \"Log versions\").")
	fs.IntVar(&f.fullEvery, "backup-full-every", 0, "strata: also make every Nth version after a files version a files version again (1: files versions only; 0: no such rule).")
	f.target.registerS3(fs)
}

// defaultLogRatio is --backup-log-ratio's default: a restore of a log
// version replays at most a quarter of its files version's bytes in log
// entries (docs/backup.md, "Log versions", gives the measured cost).
const defaultLogRatio = 0.25

func (f *memberBackupFlags) apply(cfg *member.Config) error {
	if f.logRatio < 0 || f.fullEvery < 0 {
		return fmt.Errorf("--backup-log-ratio %g, --backup-full-every %d: want 0 or more", f.logRatio, f.fullEvery)
	}
	if f.keepLast < 0 || f.keepWithin < 0 {
		return fmt.Errorf("--backup-keep-last %d, --backup-keep-within %s: want 0 or more", f.keepLast, f.keepWithin)
	}
	if (f.keepLast > 0 || f.keepWithin > 0 || f.keepExp) && f.interval == 0 {
		return errors.New("--backup-keep-last, --backup-keep-within and --backup-keep-exponential prune after the versions of --backup-interval, which is 0 (off)")
	}
	cfg.Backup = backup.Options{
		Target: f.target.url, TargetOptions: f.target.opts, Interval: f.interval, LogInterval: f.logInterval,
		Keep:   backup.Retention{KeepLast: f.keepLast, KeepWithin: f.keepWithin, Exponential: f.keepExp},
		Policy: backup.Policy{LogRatio: f.logRatio, FullEvery: f.fullEvery},
	}
	return nil
}

// logRuns writes archived log runs as "a-b (from to to), c-d (...)": a
// comma marks a gap no restore can cross; the times are the first and last
// time samples of the run, the range --to-time can restore in.
func logRuns(runs []backup.LogRun) string {
	var out []string
	for _, r := range runs {
		s := fmt.Sprintf("%d-%d", r.First, r.Last)
		if !r.From.IsZero() {
			s += fmt.Sprintf(" (%s to %s)", r.From.Format(time.RFC3339Nano), r.To.Format(time.RFC3339Nano))
		} else {
			s += " (no time samples)"
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}
