package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/engine/engines"
	"github.com/strata-kv/strata/maintenance"
	"github.com/strata-kv/strata/member"
)

// runRestore is `strata restore`, etcdutl snapshot restore's counterpart:
// it builds a new member's data directory from a backup that `etcdctl
// snapshot save` downloaded from a strata or etcd member (package etcddb),
// from an etcd member's data directory (its member/snap/db and the
// committed entries of its member/wal after it), or, with --from, from a
// version of an incremental backup (backup/FORMAT.md).
//
//	strata restore --data-dir NEW --name NAME --initial-cluster NAME=URL,...
//	    [--initial-advertise-peer-urls URL] [--initial-cluster-token TOKEN] FILE|ETCD-DATA-DIR
//	strata restore --from URL [--version N | --to-revision R | --to-index I | --to-time T]
//	    [--logger URL [--logger-cluster ID]] [--json] --data-dir NEW ... (same flags, no FILE)
//
// Start the member on NEW with the same --name, --initial-cluster and
// --initial-cluster-token: it bootstraps the new cluster's raft log over
// the restored data.
func runRestore(args []string) int {
	fs := flag.NewFlagSet("strata restore", flag.ContinueOnError)
	name := fs.String("name", "default", "Human-readable name for this member.")
	dataDir := fs.String("data-dir", "", "Path to the new data directory (default \"<name>.strata\"); it must not exist.")
	peerURLs := fs.String("initial-advertise-peer-urls", "http://127.0.0.1:2380", "This member's peer URLs.")
	cluster := fs.String("initial-cluster", "", "The new cluster, name=peerURL,... (default \"<name>=<initial-advertise-peer-urls>\").")
	token := fs.String("initial-cluster-token", "etcd-cluster", "Initial cluster token for the new cluster.")
	var tf targetFlags
	fs.StringVar(&tf.url, "from", "", "Restore from an incremental backup target (file:///dir or s3://bucket/prefix) instead of a backup file.")
	tf.registerS3(fs)
	version := fs.Uint64("version", 0, "With --from: the version to restore (0: the latest).")
	engineName := fs.String("engine", "", "The storage engine of the new data directory ("+strings.Join(engines.Names(), " or ")+"); default "+engines.Default+", or with --from the backed-up member's engine. A snapshot or a backup version of a member on one engine restores onto another.")
	toRevision := fs.Int64("to-revision", 0, "With --from: restore the state at this revision: the newest version at or before it, then the archived raft log (or --logger's) up to it (docs/backup.md, \"Point-in-time restore\").")
	toIndex := fs.Uint64("to-index", 0, "With --from: restore the state after this raft index: the newest version at or before it, then the archived raft log (or --logger's) up to it.")
	loggerURL := fs.String("logger", "", "With --to-revision or --to-index: read the committed entries after the version from this strata logger's API (its client URL) instead of the log archived in the target (docs/logger.md).")
	var loggerDial loggerDialTLSFlags
	loggerDial.register(fs)
	loggerCluster := fs.String("logger-cluster", "", "With --logger: the cluster ID (hex) whose log to read; the version's cluster must be it. Default: the version's cluster.")
	asJSON := fs.Bool("json", false, "With --from: print JSON lines on stdout for scripts: progress events, then the result (or an error) object.")
	toTimeFlag := fs.String("to-time", "", "With --from: restore the last state at or before this wall-clock time (RFC 3339, e.g. 2026-11-25T10:00:00Z): the newest version created by then, then the archived raft log up to the last entry a time sample shows applied by then (granularity one second; docs/backup.md, \"Point-in-time restore\"). Not with --logger: the times are the archive's.")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var toTime time.Time
	if *toTimeFlag != "" {
		var err error
		if toTime, err = time.Parse(time.RFC3339Nano, *toTimeFlag); err != nil {
			fmt.Fprintf(os.Stderr, "strata restore: --to-time %q: want an RFC 3339 time such as 2026-11-25T10:00:00Z or 2026-11-25T11:00:00.5+01:00\n", *toTimeFlag)
			return 2
		}
	}
	switch {
	case tf.url != "" && fs.NArg() != 0:
		fmt.Fprintln(os.Stderr, "strata restore: --from restores from a target; give no backup file")
		return 2
	case tf.url == "" && fs.NArg() != 1:
		fmt.Fprintln(os.Stderr, "strata restore: want exactly one argument (a snapshot file or an etcd data directory), or --from URL")
		return 2
	case tf.url == "" && (*version != 0 || *toRevision != 0 || *toIndex != 0 || *toTimeFlag != "" || *asJSON):
		fmt.Fprintln(os.Stderr, "strata restore: --version, --to-revision, --to-index, --to-time and --json need --from")
		return 2
	case countGiven(*version != 0, *toRevision != 0, *toIndex != 0, *toTimeFlag != "") > 1:
		fmt.Fprintln(os.Stderr, "strata restore: give one of --version, --to-revision, --to-index and --to-time")
		return 2
	case *loggerURL != "" && *toRevision == 0 && *toIndex == 0:
		fmt.Fprintln(os.Stderr, "strata restore: --logger is the source of the entries replayed by --to-revision or --to-index; give one")
		return 2
	case *loggerCluster != "" && *loggerURL == "":
		fmt.Fprintln(os.Stderr, "strata restore: --logger-cluster needs --logger")
		return 2
	case *toRevision < 0:
		fmt.Fprintln(os.Stderr, "strata restore: --to-revision must be positive")
		return 2
	}
	if *dataDir == "" {
		*dataDir = *name + ".strata"
	}
	if *cluster == "" {
		*cluster = *name + "=" + *peerURLs
	}
	if err := engines.Check(*engineName); err != nil {
		fmt.Fprintf(os.Stderr, "strata restore: %v\n", err)
		return 2
	}
	members, err := parseInitialCluster(*cluster)
	if err != nil {
		fmt.Fprintf(os.Stderr, "strata restore: %v\n", err)
		return 2
	}
	if urls := splitURLs(*peerURLs); !sameURLs(urls, members[*name]) {
		fmt.Fprintf(os.Stderr, "strata restore: --initial-advertise-peer-urls %v differ from --initial-cluster's %v for %q\n", urls, members[*name], *name)
		return 2
	}
	if tf.url != "" {
		cfg := backup.RestoreConfig{
			DataDir:             *dataDir,
			Name:                *name,
			InitialCluster:      members,
			InitialClusterToken: *token,
			ToRevision:          *toRevision,
			ToIndex:             *toIndex,
			ToTime:              toTime,
			Engine:              *engineName,
		}
		if *loggerURL != "" {
			src, err := loggerSource(*loggerURL, *loggerCluster, &loggerDial)
			if err != nil {
				fmt.Fprintf(os.Stderr, "strata restore: %v\n", err)
				return 2
			}
			defer src.Client.Close()
			cfg.Source = src
		}
		return restoreFromTarget(&tf, *version, cfg, *asJSON, os.Stdout, os.Stderr)
	}
	res, err := maintenance.Restore(maintenance.RestoreConfig{
		Backup:              fs.Arg(0),
		Engine:              *engineName,
		Name:                *name,
		DataDir:             *dataDir,
		InitialCluster:      members,
		InitialClusterToken: *token,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "strata restore: %v\n", err)
		return 1
	}
	fmt.Printf("restored %d records (applied index %d of the backed-up member) into %s: member %x of cluster %x\n",
		res.Records, res.AppliedIndex, *dataDir, res.MemberID, res.ClusterID)
	if w := res.WAL; w != nil {
		torn := ""
		if w.Torn {
			torn = "; its last record was torn (never acknowledged) and left out, as etcd leaves it out"
		}
		tail := fmt.Sprintf("its commit index is %d, its last entry %d", w.Commit, w.LastIndex)
		switch {
		case w.OneMember:
			tail += "; the member was its cluster's only voter, so its whole log is committed"
		case w.PastCommit > 0:
			tail += fmt.Sprintf("; %d entries past the commit index were left out: the member did not know them committed (migrate from the leader's data dir, or from a snapshot of the running cluster)", w.PastCommit)
		}
		fmt.Printf("replayed %d entries of etcd's WAL (%d files) after its database's consistent index %d (%s%s)\n",
			w.Entries, w.Files, w.ConsistentIndex, tail, torn)
	}
	return 0
}

// loggerSource is --logger and --logger-cluster: a client of the logger's
// API as the source of a point-in-time restore.
func loggerSource(url, cluster string, dial *loggerDialTLSFlags) (backup.LoggerSource, error) {
	var id uint64
	if cluster != "" {
		var err error
		if id, err = parseHexID("logger-cluster", cluster); err != nil {
			return backup.LoggerSource{}, err
		}
	}
	c, err := dial.dialLogger(url)
	if err != nil {
		return backup.LoggerSource{}, err
	}
	return backup.LoggerSource{Client: c, Endpoint: url, ClusterID: id}, nil
}

// parseInitialCluster reads name=peerURL,... into a map.
func parseInitialCluster(s string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, item := range strings.Split(s, ",") {
		name, u, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" || u == "" {
			return nil, fmt.Errorf("--initial-cluster: %q is not name=peerURL", item)
		}
		out[name] = append(out[name], u)
	}
	return out, nil
}

func sameURLs(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]int{}
	for _, u := range a {
		seen[u]++
	}
	for _, u := range b {
		if seen[u] == 0 {
			return false
		}
		seen[u]--
	}
	return true
}

// corruptFlags are etcd's corruption-check flags, under their 3.5 names
// (--experimental-...) and 3.6 names.
type corruptFlags struct {
	initial   bool
	checkTime time.Duration
	// gates are etcd's --feature-gates; InitialCorruptCheck is 3.7's
	// name of --initial-corrupt-check.
	gates featureGates
}

func (c *corruptFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.initial, "experimental-initial-corrupt-check", false, "Check this member's data against its peers' (HashKV) once it has caught up after start-up; a mismatch raises the CORRUPT alarm.")
	fs.BoolVar(&c.initial, "initial-corrupt-check", false, "etcd 3.6's name of --experimental-initial-corrupt-check.")
	fs.DurationVar(&c.checkTime, "experimental-corrupt-check-time", 0, "Interval of the leader's corruption check against every member (0: none).")
	fs.DurationVar(&c.checkTime, "corrupt-check-time", 0, "etcd 3.6's name of --experimental-corrupt-check-time.")
	fs.Var(&c.gates, "feature-gates", featureGatesUsage())
}

func (c *corruptFlags) apply(cfg *member.Config) {
	cfg.InitialCorruptCheck = c.initial || c.gates.Enabled("InitialCorruptCheck")
	cfg.CorruptCheckTime = c.checkTime
}

// countGiven counts the options given, of options that exclude each other.
func countGiven(given ...bool) int {
	n := 0
	for _, g := range given {
		if g {
			n++
		}
	}
	return n
}
