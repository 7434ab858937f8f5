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
// The member accepts every flag of etcd 3.7 (and etcd 3.6's
// --experimental-* names) under etcd's names, defaults and meanings, also as
// ETCD_* environment variables (a variable beside its own flag is refused,
// as etcd refuses it), or
// etcd's YAML configuration file (--config-file, ETCD_CONFIG_FILE; other
// flags and variables are then ignored, as etcd ignores them), so that
// strata can stand where an etcd binary stands. docs/flags.md lists what
// strata does with each: implemented, accepted without effect (and --help
// says why), or refused unless left at its default.
package main

import (
	"errors"
	"flag"
	"fmt"
	"github.com/strata-kv/strata/internal/etcdurl"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/strata-kv/strata/engine/engines"
	"github.com/strata-kv/strata/internal/logrotate"
	"github.com/strata-kv/strata/member"
	"github.com/strata-kv/strata/node"
	"github.com/strata-kv/strata/server"
	"github.com/strata-kv/strata/tlsconfig"
	"github.com/strata-kv/strata/transport"
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
	walDir, configFile                          string
	listenClientURLs, advertiseClientURLs       string
	listenClientHTTPURLs                        string
	maxConcurrentStreams                        uint32Value
	grpcKeepAliveMinTime, grpcKeepAliveInterval time.Duration
	grpcKeepAliveTimeout                        time.Duration
	enableGRPCGateway, strictReconfig, preVote  bool
	maxLearners, compactionBatchLimit           int
	compactionSleepInterval, warnUnaryDuration  time.Duration
	warnApplyDuration                           time.Duration
	logger, logOutputs, logFormat               string
	enableLogRotation                           bool
	logRotationConfig                           string
	cors, hostWhitelist                         string
	reusePort, reuseAddress                     bool
	listenPeerURLs, initialAdvertisePeerURLs    string
	initialCluster, initialClusterState, token  string
	forceNewCluster                             bool
	autoCompactionMode, autoCompactionRetention string
	quotaBackendBytes                           int64
	maxRequestBytes, maxTxnOps                  uint
	snapshotCount, catchUpEntries               uint64
	snapshotBytes, catchUpBytes                 uint64
	heartbeatMillis, electionMillis             uint
	logLevel                                    string
	version                                     bool
	logDirs                                     stringList
	engineWAL                                   bool
	engine                                      string
	watchProgressNotifyInterval                 time.Duration
	corrupt                                     corruptFlags
	loggerRetention, loggerTruncate             bool
	catchUpLogger                               string
	logCompaction                               logCompactionFlags
	security                                    securityFlags
	metrics                                     metricsFlags
	backup                                      memberBackupFlags
	noEffect                                    *noEffectValues
	refused                                     refusedFlags
	discovery                                   discoveryFlags
	// unrecognizedEnv are the ETCD_* variables no flag reads, to log.
	unrecognizedEnv []string
}

// uint32Value is --max-concurrent-streams: a uint32 (etcd's Uint32Value).
type uint32Value uint32

func (u *uint32Value) String() string { return strconv.FormatUint(uint64(*u), 10) }
func (u *uint32Value) Set(s string) error {
	v, err := strconv.ParseUint(s, 0, 32)
	*u = uint32Value(v)
	return err
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
	fs.BoolVar(&f.forceNewCluster, "force-new-cluster", false, "Force to create a new one-member cluster. strata: as etcd: restarted on its data directory, the member removes every other member through raft and serves alone with its member ID, cluster ID and data; add members back with member add. Unlike etcd, every entry of its raft log is kept as committed (etcd discards those past its commit index, which can hold acknowledged writes). Ignored on an empty data directory (the member starts as without it). Give it once: restart without it afterwards.")
	fs.StringVar(&f.token, "initial-cluster-token", "etcd-cluster", "Initial cluster token for the cluster during bootstrap.")
	fs.StringVar(&f.autoCompactionMode, "auto-compaction-mode", "periodic", "Interpret 'auto-compaction-retention' as a duration ('periodic') or a number of revisions ('revision').")
	fs.StringVar(&f.autoCompactionRetention, "auto-compaction-retention", "0", "Auto compaction retention for the MVCC key value store. 0 means disable auto compaction.")
	fs.Int64Var(&f.quotaBackendBytes, "quota-backend-bytes", 0, "Raise the NOSPACE alarm and refuse writes when the engine's files exceed this size (0: no quota).")
	fs.UintVar(&f.maxRequestBytes, "max-request-bytes", 1.5*1024*1024, "Maximum client request size in bytes the server will accept.")
	fs.UintVar(&f.maxTxnOps, "max-txn-ops", 128, "Maximum number of operations permitted in a transaction.")
	fs.Uint64Var(&f.snapshotCount, "snapshot-count", 10000, "Number of applied entries after which the engine is flushed and the raft log compacted.")
	fs.Uint64Var(&f.catchUpEntries, "snapshot-catchup-entries", 5000, "Number of entries kept in the raft log below the compaction point, for slow followers to catch up from.")
	fs.Uint64Var(&f.snapshotBytes, "snapshot-bytes", node.DefaultSnapshotBytes, "strata: --snapshot-count in bytes of applied entries: the engine is also flushed and the raft log compacted after this many, once the log holds this plus --snapshot-catchup-bytes past its last compaction.")
	fs.Uint64Var(&f.catchUpBytes, "snapshot-catchup-bytes", node.DefaultCatchUpBytes, "strata: at most this many bytes of entries are kept below the compaction point (fewer than --snapshot-catchup-entries when those hold more).")
	fs.UintVar(&f.heartbeatMillis, "heartbeat-interval", 100, "Time (in milliseconds) of a heartbeat interval.")
	fs.UintVar(&f.electionMillis, "election-timeout", 1000, "Time (in milliseconds) for an election to timeout.")
	fs.BoolVar(&f.version, "version", false, "Print the version (etcd's format: the etcd API version strata implements, then strata's own line) and exit.")
	fs.StringVar(&f.logLevel, "log-level", "info", "Configures log level. Only supports debug, info, warn, error, panic, or fatal.")
	fs.Var(&f.logDirs, "log-dir", "strata: a directory for the raft log (default \"<data-dir>/log\"). Repeatable: each write is split across the directories and synced in parallel; keep the same list, in the same order, across restarts.")
	fs.DurationVar(&f.watchProgressNotifyInterval, "watch-progress-notify-interval", 10*time.Minute, "Duration of periodic watch progress notifications.")
	fs.DurationVar(&f.watchProgressNotifyInterval, "experimental-watch-progress-notify-interval", 10*time.Minute, "Deprecated name of --watch-progress-notify-interval.")
	fs.BoolVar(&f.loggerRetention, "logger-retention", false, "strata: keep the raft log until every strata logger in the cluster holds it (the leader by what each acknowledged, a follower by what each logger's Status says), so that a logger behind catches up from the log and records no gap; a logger down holds the log from being truncated until it returns or is removed.")
	fs.BoolVar(&f.loggerTruncate, "logger-truncate", false, "strata: ask every strata logger in the cluster, at its published client URL, to truncate its log up to this member's engine durable index as that advances, and with --backup-target at most up to the newest backup version's raft index, so that a restore from it can replay the log after it (a logger trims only at the index more than half of the voters asked for; see strata logger truncate).")
	fs.StringVar(&f.catchUpLogger, "catch-up-logger", "", "strata: a strata logger's client URL: a member joining a running cluster (--initial-cluster-state=existing) with an empty data directory first copies the committed log the logger holds (from index 1) into its own, so that the leader sends it only the entries after it instead of a snapshot; refused if the logger does not hold the log from index 1. A member restarting on its data copies the committed entries it missed while down, and tells the leader, so that it gets no snapshot either; if the logger does not hold them it starts anyway and the leader sends what it lacks. A running member behind the leader's log takes the entries from the logger when the leader's snapshot arrives, and refuses the snapshot (docs/logger.md).")
	fs.BoolVar(&f.engineWAL, "engine-wal", false, "strata: turn the engine's own WAL on, synced per apply batch (the double-logging baseline).")
	fs.StringVar(&f.engine, "engine", engines.Default, "strata: the storage engine, "+strings.Join(engines.Names(), " or ")+"; chosen when the data directory is created and recorded there (a restart with another is refused; strata restore --engine moves data to another). docs/engines.md.")
	fs.StringVar(&f.configFile, "config-file", "", "Path to the server configuration file (etcd's YAML). Note that if a configuration file is provided, other command line flags and environment variables will be ignored.")
	fs.StringVar(&f.walDir, "wal-dir", "", "Path to the dedicated wal directory. strata: the raft log's directory, as one --log-dir.")
	fs.StringVar(&f.listenClientHTTPURLs, "listen-client-http-urls", "", "List of URLs to listen on for http only client traffic. Enabling this flag removes http services from --listen-client-urls.")
	f.maxConcurrentStreams = math.MaxUint32
	fs.Var(&f.maxConcurrentStreams, "max-concurrent-streams", "Maximum concurrent streams that each client can open at a time.")
	fs.DurationVar(&f.grpcKeepAliveMinTime, "grpc-keepalive-min-time", 5*time.Second, "Minimum duration interval that a client should wait before pinging server.")
	fs.DurationVar(&f.grpcKeepAliveInterval, "grpc-keepalive-interval", 2*time.Hour, "Frequency duration of server-to-client ping to check if a connection is alive (0 to disable).")
	fs.DurationVar(&f.grpcKeepAliveTimeout, "grpc-keepalive-timeout", 20*time.Second, "Additional duration of wait before closing a non-responsive connection (0 to disable).")
	fs.BoolVar(&f.enableGRPCGateway, "enable-grpc-gateway", true, "Enable GRPC gateway (etcd's JSON gateway on /v3/).")
	fs.BoolVar(&f.strictReconfig, "strict-reconfig-check", true, "Reject reconfiguration requests that would cause quorum loss.")
	fs.BoolVar(&f.preVote, "pre-vote", true, "Enable the raft Pre-Vote algorithm to prevent disruption when a node that has been partitioned away rejoins the cluster.")
	fs.IntVar(&f.compactionBatchLimit, "compaction-batch-limit", 0, "Sets the maximum revisions deleted in each compaction batch. strata: the revision-index entries one engine batch of physical revision compaction visits (0: 1000).")
	fs.IntVar(&f.compactionBatchLimit, "experimental-compaction-batch-limit", 0, "etcd 3.6's name of --compaction-batch-limit.")
	fs.DurationVar(&f.compactionSleepInterval, "compaction-sleep-interval", 0, "Sets the sleep interval between each compaction batch. strata: 0 does not wait (etcd waits 10ms).")
	fs.DurationVar(&f.compactionSleepInterval, "experimental-compaction-sleep-interval", 0, "etcd 3.6's name of --compaction-sleep-interval.")
	fs.DurationVar(&f.warnUnaryDuration, "warning-unary-request-duration", 300*time.Millisecond, "Set time duration after which a warning is logged if a unary request takes more than this duration.")
	fs.DurationVar(&f.warnUnaryDuration, "experimental-warning-unary-request-duration", 300*time.Millisecond, "etcd 3.6's name of --warning-unary-request-duration.")
	fs.DurationVar(&f.warnApplyDuration, "warning-apply-duration", 100*time.Millisecond, "Warning is generated if requests take more than this duration. strata: the apply of replicated requests; read-only requests are not timed.")
	fs.DurationVar(&f.warnApplyDuration, "experimental-warning-apply-duration", 100*time.Millisecond, "etcd 3.6's name of --warning-apply-duration.")
	fs.IntVar(&f.maxLearners, "max-learners", 1, "Set the max number of learner members allowed in the cluster membership.")
	fs.IntVar(&f.maxLearners, "experimental-max-learners", 1, "etcd 3.6's name of --max-learners.")
	fs.Uint64Var(&f.catchUpEntries, "experimental-snapshot-catchup-entries", 5000, "etcd 3.6's name of --snapshot-catchup-entries.")
	fs.BoolVar(&f.reusePort, "socket-reuse-port", false, "Enable to set socket option SO_REUSEPORT on listeners allowing rebinding of a port already in use.")
	fs.BoolVar(&f.reuseAddress, "socket-reuse-address", false, "Enable to set socket option SO_REUSEADDR on listeners allowing binding to an address in TIME_WAIT state.")
	fs.StringVar(&f.cors, "cors", "*", "Comma-separated whitelist of origins for CORS, or cross-origin resource sharing, (empty or * means allow all).")
	fs.StringVar(&f.hostWhitelist, "host-whitelist", "*", "Acceptable hostnames from HTTP client requests, if server is not secure (empty or * means allow all).")
	fs.StringVar(&f.logger, "logger", "zap", "Currently only supports 'zap' for structured logging.")
	fs.StringVar(&f.logOutputs, "log-outputs", "default", "Specify 'stdout' or 'stderr' to skip journald logging even when running under systemd, or list of comma separated output targets. strata: 'default' and 'systemd/journal' write to stderr (which systemd hands to the journal).")
	fs.StringVar(&f.logFormat, "log-format", "json", "Configures log format. Only supports json, console.")
	fs.BoolVar(&f.enableLogRotation, "enable-log-rotation", false, "Enable log rotation of a single log-outputs file target.")
	fs.StringVar(&f.logRotationConfig, "log-rotation-config-json", `{"maxsize": 100, "maxage": 0, "maxbackups": 0, "localtime": false, "compress": false}`,
		"Configures log rotation if enabled with a JSON logger config. MaxSize(MB), MaxAge(days,0=no limit), MaxBackups(0=no limit), LocalTime(use computers local time), Compress(gzip).")
	f.noEffect = registerNoEffect(fs)
	f.refused.register(fs)
	f.discovery.register(fs)
	f.corrupt.register(fs)
	f.logCompaction.register(fs)
	f.security.register(fs)
	f.metrics.register(fs)
	f.backup.register(fs)
	return fs
}

// applyEnv sets every flag not given on the command line from its
// non-empty ETCD_* environment variable, with etcd's rules: a variable for
// a flag also given on the command line is refused (etcd stops with the
// same words); ETCD_VERSION is no flag's variable (else a container image
// that sets it would only print the version); the other ETCD_* variables
// that no flag reads are returned, for the log, as etcd logs them.
func applyEnv(fs *flag.FlagSet, given map[string]bool) (unrecognized []string, err error) {
	used := map[string]bool{"ETCD_VERSION": true, "ETCD_CONFIG_FILE": true}
	fs.VisitAll(func(fl *flag.Flag) {
		key := "ETCD_" + strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_"))
		v := os.Getenv(key)
		if err != nil || v == "" || used[key] {
			return
		}
		used[key] = true
		if given[fl.Name] {
			err = fmt.Errorf("conflicting environment variable %s is shadowed by corresponding command-line flag --%s (either unset environment variable or disable flag)", key, fl.Name)
			return
		}
		if e := fs.Set(fl.Name, v); e != nil {
			err = fmt.Errorf("invalid value %q for %s: %w", v, key, e)
		}
	})
	for _, kv := range os.Environ() {
		key, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(key, "ETCD_") && !used[key] {
			unrecognized = append(unrecognized, kv)
		}
	}
	return unrecognized, err
}

// errPrinted is a parse error the flag package has already printed, with
// the usage, as etcd's does.
var errPrinted = errors.New("flag error printed")

// loadFlags reads the member's configuration as etcd does: the command
// line; then, when --config-file (or ETCD_CONFIG_FILE) names a file, that
// file alone over etcd's defaults (the other flags and the environment are
// ignored); else the ETCD_* variable of every flag not given. It returns
// nil flags after --help.
func loadFlags(args []string) (*flags, error) {
	f := &flags{}
	fs := newFlagSet(f)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil
		}
		return nil, errPrinted
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%q is not a valid flag (flags start with --)", fs.Arg(0))
	}
	if f.version {
		return f, nil
	}
	path := f.configFile
	if path == "" {
		path = os.Getenv("ETCD_CONFIG_FILE")
	}
	if path != "" {
		fc := &flags{}
		if err := applyConfigFile(newFlagSet(fc), path); err != nil {
			return nil, err
		}
		fc.configFile = path
		return fc, nil
	}
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	unrecognized, err := applyEnv(fs, given)
	if err != nil {
		return nil, err
	}
	f.unrecognizedEnv = unrecognized
	// etcd's rule, on the command line and the environment (not in a
	// file): a member listening elsewhere must say where clients reach it.
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if set["listen-client-urls"] && !set["advertise-client-urls"] {
		return nil, errors.New("--advertise-client-urls is required when --listen-client-urls is set explicitly")
	}
	return f, nil
}

func runMember(args []string) int {
	f, err := loadFlags(args)
	switch {
	case errors.Is(err, errPrinted):
		return 2
	case err != nil:
		fmt.Fprintf(os.Stderr, "strata: %v\n", err)
		return 2
	case f == nil:
		return 0
	case f.version:
		printVersion(os.Stdout)
		return 0
	}
	logger, err := newLogger(f.logLevel, f.logger, f.logOutputs, f.logFormat, f.rotation())
	if err != nil {
		fmt.Fprintf(os.Stderr, "strata: %v\n", err)
		return 2
	}
	defer func() { _ = logger.Sync() }()
	if v := os.Getenv("ETCD_VERSION"); v != "" {
		logger.Warn("cannot set special environment variable", zap.String("key", "ETCD_VERSION"), zap.String("value", v))
	}
	for _, env := range f.unrecognizedEnv {
		logger.Warn("unrecognized environment variable", zap.String("environment-variable", env))
	}
	if f.configFile != "" {
		logger.Info("loaded server configuration, other configuration command line flags and environment variables will be ignored if provided",
			zap.String("path", f.configFile))
	}
	cfg, err := f.config(logger)
	if err != nil {
		fmt.Fprintf(os.Stderr, "strata: %v\n", err)
		return 2
	}
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

// config is every flag's contribution to the member's configuration, after
// the checks and refusals etcd's flags get; logger reports the
// certificates --auto-tls and --peer-auto-tls generate.
func (f *flags) config(logger *zap.Logger) (member.Config, error) {
	if err := f.refused.check(); err != nil {
		return member.Config{}, err
	}
	if err := f.noEffect.check(); err != nil {
		return member.Config{}, err
	}
	if err := f.corrupt.gates.check(); err != nil {
		return member.Config{}, err
	}
	// Before memberConfig, which fills in the default --initial-cluster.
	dc, discover, err := f.discovery.config(f.initialCluster)
	if err != nil {
		return member.Config{}, err
	}
	cfg, err := f.memberConfig()
	if err != nil {
		return member.Config{}, err
	}
	if discover {
		applyDiscovery(&cfg, dc, logger)
	}
	f.corrupt.apply(&cfg)
	if err := f.logCompaction.apply(&cfg); err != nil {
		return member.Config{}, err
	}
	if err := f.metrics.apply(&cfg); err != nil {
		return member.Config{}, err
	}
	if err := f.backup.apply(&cfg); err != nil {
		return member.Config{}, err
	}
	// Last: --auto-tls writes its certificates once everything else has
	// been accepted.
	if err := f.security.apply(&cfg, logger); err != nil {
		return member.Config{}, err
	}
	return cfg, nil
}

func (f *flags) memberConfig() (member.Config, error) {
	if f.dataDir == "" {
		f.dataDir = f.name + ".strata"
	}
	if f.initialCluster == "" {
		f.initialCluster = f.name + "=" + f.initialAdvertisePeerURLs
	}
	cluster, err := parseInitialCluster(f.initialCluster)
	if err != nil {
		return member.Config{}, err
	}
	// etcd's checks, in etcd's words.
	switch f.initialClusterState {
	case "new", "existing":
	default:
		return member.Config{}, fmt.Errorf("invalid value %q for flag -initial-cluster-state: invalid value", f.initialClusterState)
	}
	switch f.autoCompactionMode {
	case "periodic", "revision":
	case "":
		return member.Config{}, errors.New("undefined auto-compaction-mode")
	default:
		return member.Config{}, fmt.Errorf("unknown auto-compaction-mode %q", f.autoCompactionMode)
	}
	switch {
	case f.heartbeatMillis == 0:
		return member.Config{}, fmt.Errorf("--heartbeat-interval must be >0 (set to %dms)", f.heartbeatMillis)
	case f.electionMillis == 0:
		return member.Config{}, fmt.Errorf("--election-timeout must be >0 (set to %dms)", f.electionMillis)
	case f.electionMillis < 5*f.heartbeatMillis:
		return member.Config{}, fmt.Errorf("--election-timeout[%vms] should be at least as 5 times as --heartbeat-interval[%vms]", f.electionMillis, f.heartbeatMillis)
	case f.electionMillis > 50000:
		return member.Config{}, fmt.Errorf("--election-timeout[%vms] is too long, and should be set less than %vms", f.electionMillis, 50000)
	}
	if f.maxTxnOps == 0 {
		return member.Config{}, errors.New("--max-txn-ops must be positive")
	}
	logDirs := f.logDirs
	if f.walDir != "" {
		if len(logDirs) > 0 && !(len(logDirs) == 1 && logDirs[0] == f.walDir) {
			return member.Config{}, fmt.Errorf("--wal-dir %s and --log-dir %v both name the raft log's directory: give one of them", f.walDir, []string(logDirs))
		}
		logDirs = []string{f.walDir}
	}
	for _, origin := range commaList(f.cors) {
		if err := checkOrigin(origin); err != nil {
			return member.Config{}, fmt.Errorf("invalid value %q for flag -cors: %w", f.cors, err)
		}
	}
	if f.compactionBatchLimit < 0 || f.compactionSleepInterval < 0 {
		return member.Config{}, fmt.Errorf("--compaction-batch-limit %d, --compaction-sleep-interval %v: negative", f.compactionBatchLimit, f.compactionSleepInterval)
	}
	if f.maxLearners < 1 {
		// membership.Config reads 0 as etcd's default of 1; a limit of 0
		// would refuse every learner, which etcd allows but no one needs.
		return member.Config{}, fmt.Errorf("--max-learners=%d: strata needs at least 1", f.maxLearners)
	}
	if err := engines.Check(f.engine); err != nil {
		return member.Config{}, fmt.Errorf("--engine: %w", err)
	}
	httpSecure, err := tlsconfig.URLsSecure("--listen-client-http-urls", splitURLs(f.listenClientHTTPURLs))
	if err != nil {
		return member.Config{}, err
	}
	if clientSecure, err := tlsconfig.URLsSecure("--listen-client-urls", splitURLs(f.listenClientURLs)); err == nil &&
		f.listenClientHTTPURLs != "" && httpSecure != clientSecure {
		return member.Config{}, errors.New("--listen-client-http-urls: strata serves them with the client URLs' TLS, so both must be http or both https")
	}
	return member.Config{
		Name:                        f.name,
		DataDir:                     f.dataDir,
		LogDirs:                     logDirs,
		ListenClientURLs:            splitURLs(f.listenClientURLs),
		AdvertiseClientURLs:         splitURLs(f.advertiseClientURLs),
		ListenPeerURLs:              splitURLs(f.listenPeerURLs),
		AdvertisePeerURLs:           splitURLs(f.initialAdvertisePeerURLs),
		InitialCluster:              cluster,
		InitialClusterState:         f.initialClusterState,
		ForceNewCluster:             f.forceNewCluster,
		InitialClusterToken:         f.token,
		AutoCompactionMode:          f.autoCompactionMode,
		AutoCompactionRetention:     f.autoCompactionRetention,
		QuotaBackendBytes:           f.quotaBackendBytes,
		SnapshotCount:               f.snapshotCount,
		CatchUpEntries:              f.catchUpEntries,
		SnapshotBytes:               f.snapshotBytes,
		CatchUpBytes:                f.catchUpBytes,
		HeartbeatInterval:           time.Duration(f.heartbeatMillis) * time.Millisecond,
		ElectionTimeout:             time.Duration(f.electionMillis) * time.Millisecond,
		EngineWAL:                   f.engineWAL,
		Engine:                      f.engine,
		WatchProgressNotifyInterval: f.watchProgressNotifyInterval,
		DisablePreVote:              !f.preVote,
		MaxLearners:                 f.maxLearners,
		NoStrictReconfig:            !f.strictReconfig,
		Sockets:                     transport.ListenConfig{ReusePort: f.reusePort, ReuseAddress: f.reuseAddress},
		CompactionBatchLimit:        f.compactionBatchLimit,
		CompactionSleepInterval:     f.compactionSleepInterval,
		WarningApplyDuration:        f.warnApplyDuration,
		LoggerRetention:             f.loggerRetention,
		LoggerTruncate:              f.loggerTruncate,
		CatchUpLogger:               f.catchUpLogger,
		Client: server.ClientOptions{
			ListenHTTPURLs: splitURLs(f.listenClientHTTPURLs),
			NoGateway:      !f.enableGRPCGateway,
			Access:         server.AccessControl{CORS: commaList(f.cors), HostWhitelist: commaList(f.hostWhitelist)},
			Limits: server.Limits{
				MaxRequestBytes: int(f.maxRequestBytes), MaxTxnOps: int(f.maxTxnOps),
				MaxConcurrentStreams: uint32(f.maxConcurrentStreams), KeepAliveMinTime: f.grpcKeepAliveMinTime,
				KeepAliveInterval: f.grpcKeepAliveInterval, KeepAliveTimeout: f.grpcKeepAliveTimeout,
			},
			WarnUnaryDuration: f.warnUnaryDuration,
		},
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

// rotation is --enable-log-rotation's configuration: nil when off.
func (f *flags) rotation() *string {
	if !f.enableLogRotation {
		return nil
	}
	return &f.logRotationConfig
}

// newLogger builds the zap logger of --log-level, --logger, --log-outputs
// and --log-format, with etcd's rules and errors: 'default' alone or not at
// all, 'systemd/journal' alone (both write to stderr, which systemd hands
// to the journal), 'stderr', 'stdout' and file paths otherwise. With
// rotation (--enable-log-rotation, its --log-rotation-config-json), the
// one file among the outputs is rotated (internal/logrotate).
func newLogger(level, logger, outputs, format string, rotation *string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	switch logger {
	case "zap":
	case "capnslog":
		return nil, errors.New("--logger=capnslog is removed in v3.5")
	default:
		return nil, fmt.Errorf("unknown logger option %q", logger)
	}
	outs := splitURLs(outputs)
	if len(outs) == 0 {
		outs = []string{"default"}
	}
	var paths []string
	for _, o := range outs {
		switch o {
		case "default", "systemd/journal":
			if len(outs) > 1 {
				return nil, fmt.Errorf("multi logoutput for %q is not supported yet", o)
			}
			paths = append(paths, "stderr")
		default:
			paths = append(paths, o)
		}
	}
	if format != "json" && format != "console" {
		return nil, fmt.Errorf("unknown log format: %s, supported values json, console", format)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Sampling = nil
	cfg.Encoding = format
	cfg.OutputPaths = paths
	cfg.ErrorOutputPaths = paths
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	if rotation == nil {
		return cfg.Build()
	}
	return rotatingLogger(cfg, paths, *rotation)
}

// errRotationOutputs is etcd's refusal of rotation without exactly one
// file among the log outputs.
var errRotationOutputs = errors.New("--log-outputs requires a single file path when --log-rotate-config-json is defined")

// rotatingLogger is cfg's logger with its one file output rotated.
func rotatingLogger(cfg zap.Config, paths []string, rotationJSON string) (*zap.Logger, error) {
	var file string
	for _, p := range paths {
		if p != "stderr" && p != "stdout" {
			if file != "" {
				return nil, errRotationOutputs
			}
			file = p
		}
	}
	if file == "" {
		return nil, errRotationOutputs
	}
	rc, err := logrotate.ParseConfig(rotationJSON)
	if err != nil {
		return nil, err
	}
	var sinks []zapcore.WriteSyncer
	for _, p := range paths {
		if p == file {
			w, err := logrotate.Open(file, rc)
			if err != nil {
				return nil, fmt.Errorf("--log-outputs: %w", err)
			}
			sinks = append(sinks, w)
			continue
		}
		ws, _, err := zap.Open(p)
		if err != nil {
			return nil, err
		}
		sinks = append(sinks, ws)
	}
	enc := zapcore.NewJSONEncoder(cfg.EncoderConfig)
	if cfg.Encoding == "console" {
		enc = zapcore.NewConsoleEncoder(cfg.EncoderConfig)
	}
	out := zapcore.NewMultiWriteSyncer(sinks...)
	return zap.New(zapcore.NewCore(enc, out, cfg.Level), zap.AddCaller(), zap.AddStacktrace(zap.ErrorLevel), zap.ErrorOutput(out)), nil
}

// checkOrigin applies etcd's rule to a --cors origin: "*", or a URL by
// etcd's rules (etcdurl).
func checkOrigin(origin string) error {
	if origin == "*" {
		return nil
	}
	return etcdurl.Check(origin)
}
