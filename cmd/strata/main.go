// Command strata runs a strata member, a key-value store that speaks the
// etcd v3 API, and its tools.
//
//	strata [flags]                         run a member (etcd's flags)
//	strata inspect log --data-dir D        list the raft log's segments
//	strata inspect log --data-dir D --entries  print its entries as JSON
//	strata restore --data-dir NEW ... FILE build a data dir from a backup
//	strata health [--endpoint URL]         exit 0 if the member is healthy
//	strata restore --from URL [--version N] --data-dir NEW ...
//	                                       the same from an incremental backup
//	strata backup create|list|verify|prune incremental backups of engine files
//	strata logger [join|status|recover]    the logger service (docs/logger.md)
//
// The member accepts etcd's flags under etcd's names and meanings, also as
// ETCD_* environment variables (a flag given on the command line wins), so
// that strata can stand where an etcd binary stands.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/strata-kv/strata/member"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "inspect" {
		os.Exit(runInspect(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "restore" {
		os.Exit(runRestore(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "health" {
		os.Exit(runHealth(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "logger" {
		os.Exit(runLogger(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "backup" {
		os.Exit(runBackup(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(runMember(os.Args[1:]))
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error {
	*s = append(*s, v)
	return nil
}

// flags holds the member's command line.
type flags struct {
	name, dataDir                               string
	listenClientURLs, advertiseClientURLs       string
	listenPeerURLs, initialAdvertisePeerURLs    string
	initialCluster, initialClusterState, token  string
	autoCompactionMode, autoCompactionRetention string
	quotaBackendBytes                           int64
	maxRequestBytes, maxTxnOps                  uint
	snapshotCount, catchUpEntries               uint64
	heartbeatMillis, electionMillis             uint
	logLevel                                    string
	version                                     bool
	logDirs                                     stringList
	engineWAL                                   bool
	watchProgressNotifyInterval                 time.Duration
	corrupt                                     corruptFlags
	loggerRetention, loggerTruncate             bool
	logCompaction                               logCompactionFlags
	security                                    securityFlags
	metrics                                     metricsFlags
}

func newFlagSet(f *flags) *flag.FlagSet {
	fs := flag.NewFlagSet("strata", flag.ContinueOnError)
	fs.StringVar(&f.name, "name", "default", "Human-readable name for this member.")
	fs.StringVar(&f.dataDir, "data-dir", "", "Path to the data directory (default \"<name>.strata\").")
	fs.StringVar(&f.listenClientURLs, "listen-client-urls", "http://127.0.0.1:2379", "List of URLs to listen on for client traffic.")
	fs.StringVar(&f.advertiseClientURLs, "advertise-client-urls", "http://127.0.0.1:2379", "List of this member's client URLs to advertise to the cluster.")
	fs.StringVar(&f.listenPeerURLs, "listen-peer-urls", "http://127.0.0.1:2380", "List of URLs to listen on for peer traffic.")
	fs.StringVar(&f.initialAdvertisePeerURLs, "initial-advertise-peer-urls", "http://127.0.0.1:2380", "List of this member's peer URLs to advertise to the cluster; with the token they determine the member ID.")
	fs.StringVar(&f.initialCluster, "initial-cluster", "", "Initial cluster configuration for bootstrapping, name=peerURL,... (default \"<name>=<initial-advertise-peer-urls>\").")
	fs.StringVar(&f.initialClusterState, "initial-cluster-state", "new", "Initial cluster state ('new' or 'existing'). Ignored once the data directory holds a member: the data directory wins.")
	fs.StringVar(&f.token, "initial-cluster-token", "etcd-cluster", "Initial cluster token for the cluster during bootstrap.")
	fs.StringVar(&f.autoCompactionMode, "auto-compaction-mode", "periodic", "Interpret 'auto-compaction-retention' as a duration ('periodic') or a number of revisions ('revision').")
	fs.StringVar(&f.autoCompactionRetention, "auto-compaction-retention", "0", "Auto compaction retention for the MVCC key value store. 0 means disable auto compaction.")
	fs.Int64Var(&f.quotaBackendBytes, "quota-backend-bytes", 0, "Raise the NOSPACE alarm and refuse writes when the engine's files exceed this size (0: no quota).")
	fs.UintVar(&f.maxRequestBytes, "max-request-bytes", 1.5*1024*1024, "Maximum client request size in bytes the server will accept.")
	fs.UintVar(&f.maxTxnOps, "max-txn-ops", 128, "Maximum number of operations permitted in a transaction.")
	fs.Uint64Var(&f.snapshotCount, "snapshot-count", 10000, "Number of applied entries after which the engine is flushed and the raft log compacted.")
	fs.Uint64Var(&f.catchUpEntries, "snapshot-catchup-entries", 5000, "Number of entries kept in the raft log below the compaction point, for slow followers to catch up from.")
	fs.UintVar(&f.heartbeatMillis, "heartbeat-interval", 100, "Time (in milliseconds) of a heartbeat interval.")
	fs.UintVar(&f.electionMillis, "election-timeout", 1000, "Time (in milliseconds) for an election to timeout.")
	fs.BoolVar(&f.version, "version", false, "Print the version (etcd's format: the etcd API version strata implements, then strata's own line) and exit.")
	fs.StringVar(&f.logLevel, "log-level", "info", "Configures log level. Only supports debug, info, warn, error, panic, or fatal.")
	fs.Var(&f.logDirs, "log-dir", "strata: a directory for the raft log (default \"<data-dir>/log\"). Repeatable: each write is split across the directories and synced in parallel; keep the same list, in the same order, across restarts.")
	fs.DurationVar(&f.watchProgressNotifyInterval, "watch-progress-notify-interval", 10*time.Minute, "Duration of periodic watch progress notifications.")
	fs.DurationVar(&f.watchProgressNotifyInterval, "experimental-watch-progress-notify-interval", 10*time.Minute, "Deprecated name of --watch-progress-notify-interval.")
	fs.BoolVar(&f.loggerRetention, "logger-retention", false, "strata: keep the raft log until every strata logger in the cluster holds it (the leader by what each acknowledged, a follower by what each logger's Status says), so that a logger behind catches up from the log and records no gap; a logger down holds the log from being truncated until it returns or is removed.")
	fs.BoolVar(&f.loggerTruncate, "logger-truncate", false, "strata: ask every strata logger in the cluster, at its published client URL, to truncate its log up to this member's engine durable index as that advances (a logger trims only at the index more than half of the voters asked for; see strata logger truncate).")
	fs.BoolVar(&f.engineWAL, "engine-wal", false, "strata: turn the engine's own WAL on, synced per apply batch (the double-logging baseline).")
	f.corrupt.register(fs)
	f.logCompaction.register(fs)
	f.security.register(fs)
	f.metrics.register(fs)
	return fs
}

// applyEnv sets every flag not given on the command line from its ETCD_*
// environment variable, as etcd does.
func applyEnv(fs *flag.FlagSet, given map[string]bool) error {
	var err error
	fs.VisitAll(func(fl *flag.Flag) {
		if err != nil || given[fl.Name] {
			return
		}
		key := "ETCD_" + strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_"))
		if v, ok := os.LookupEnv(key); ok {
			if e := fs.Set(fl.Name, v); e != nil {
				err = fmt.Errorf("invalid value %q for %s: %w", v, key, e)
			}
		}
	})
	return err
}

func runMember(args []string) int {
	var f flags
	fs := newFlagSet(&f)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "strata: unexpected argument %q (flags start with --)\n", fs.Arg(0))
		return 2
	}
	if f.version {
		printVersion(os.Stdout)
		return 0
	}
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	if err := applyEnv(fs, given); err != nil {
		fmt.Fprintf(os.Stderr, "strata: %v\n", err)
		return 2
	}
	cfg, err := f.memberConfig()
	if err != nil {
		fmt.Fprintf(os.Stderr, "strata: %v\n", err)
		return 2
	}
	f.corrupt.apply(&cfg)
	if err := f.logCompaction.apply(&cfg); err != nil {
		fmt.Fprintf(os.Stderr, "strata: %v\n", err)
		return 2
	}
	if cfg.LoggerRetention && cfg.LogCompaction.Enabled {
		// Log compaction rewrites applied entries into batch files on its
		// own schedule, past any point a logger acknowledged.
		fmt.Fprintln(os.Stderr, "strata: --logger-retention is not supported with --log-compaction yet")
		return 2
	}
	f.security.apply(&cfg)
	if err := f.metrics.apply(&cfg); err != nil {
		fmt.Fprintf(os.Stderr, "strata: %v\n", err)
		return 2
	}
	logger, err := newLogger(f.logLevel)
	if err != nil {
		fmt.Fprintf(os.Stderr, "strata: %v\n", err)
		return 2
	}
	defer func() { _ = logger.Sync() }()
	cfg.Logger = logger

	m, err := member.Start(cfg)
	if err != nil {
		logger.Error("cannot start member", zap.Error(err))
		fmt.Fprintf(os.Stderr, "strata: %v\n", err)
		return 1
	}
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	select {
	case sig := <-sigc:
		logger.Info("stopping on signal", zap.String("signal", sig.String()))
		if err := m.Stop(); err != nil {
			logger.Error("stop", zap.Error(err))
			return 1
		}
		return 0
	case <-m.Done():
		err := m.Err()
		_ = m.Stop()
		if err != nil {
			fmt.Fprintf(os.Stderr, "strata: fatal: %v\n", err)
			return 1
		}
		return 0
	}
}

func (f *flags) memberConfig() (member.Config, error) {
	if f.dataDir == "" {
		f.dataDir = f.name + ".strata"
	}
	if f.initialCluster == "" {
		f.initialCluster = f.name + "=" + f.initialAdvertisePeerURLs
	}
	cluster := map[string][]string{}
	for _, item := range strings.Split(f.initialCluster, ",") {
		name, u, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" || u == "" {
			return member.Config{}, fmt.Errorf("--initial-cluster: %q is not name=peerURL", item)
		}
		cluster[name] = append(cluster[name], u)
	}
	switch f.initialClusterState {
	case "new", "existing":
	default:
		return member.Config{}, fmt.Errorf("--initial-cluster-state: %q is neither 'new' nor 'existing'", f.initialClusterState)
	}
	switch f.autoCompactionMode {
	case "periodic", "revision":
	default:
		return member.Config{}, fmt.Errorf("--auto-compaction-mode: %q is neither 'periodic' nor 'revision'", f.autoCompactionMode)
	}
	if f.heartbeatMillis == 0 || f.electionMillis < 5*f.heartbeatMillis {
		return member.Config{}, fmt.Errorf("--election-timeout[%vms] should be at least as 5 times as --heartbeat-interval[%vms]", f.electionMillis, f.heartbeatMillis)
	}
	if f.maxTxnOps == 0 {
		return member.Config{}, errors.New("--max-txn-ops must be positive")
	}
	return member.Config{
		Name:                        f.name,
		DataDir:                     f.dataDir,
		LogDirs:                     f.logDirs,
		ListenClientURLs:            splitURLs(f.listenClientURLs),
		AdvertiseClientURLs:         splitURLs(f.advertiseClientURLs),
		ListenPeerURLs:              splitURLs(f.listenPeerURLs),
		AdvertisePeerURLs:           splitURLs(f.initialAdvertisePeerURLs),
		InitialCluster:              cluster,
		InitialClusterState:         f.initialClusterState,
		InitialClusterToken:         f.token,
		AutoCompactionMode:          f.autoCompactionMode,
		AutoCompactionRetention:     f.autoCompactionRetention,
		QuotaBackendBytes:           f.quotaBackendBytes,
		MaxRequestBytes:             int(f.maxRequestBytes),
		MaxTxnOps:                   int(f.maxTxnOps),
		SnapshotCount:               f.snapshotCount,
		CatchUpEntries:              f.catchUpEntries,
		HeartbeatInterval:           time.Duration(f.heartbeatMillis) * time.Millisecond,
		ElectionTimeout:             time.Duration(f.electionMillis) * time.Millisecond,
		EngineWAL:                   f.engineWAL,
		WatchProgressNotifyInterval: f.watchProgressNotifyInterval,
		LoggerRetention:             f.loggerRetention,
		LoggerTruncate:              f.loggerTruncate,
	}, nil
}

func splitURLs(s string) []string {
	var out []string
	for _, u := range strings.Split(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Sampling = nil
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	return cfg.Build()
}
