package member

import (
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/tlsconfig"
	"github.com/strata-kv/strata/transport"
)

// Config is a member's configuration, in etcd's terms.
type Config struct {
	Name    string
	DataDir string
	// LogDirs hold the raft log; empty means <data-dir>/log.
	LogDirs []string
	// FS is the file system for every file the member writes; nil means
	// the operating system's.
	FS vfs.FS

	ListenClientURLs    []string
	AdvertiseClientURLs []string
	ListenPeerURLs      []string
	AdvertisePeerURLs   []string
	// InitialCluster maps member names to peer URLs (--initial-cluster).
	InitialCluster      map[string][]string
	InitialClusterState string
	InitialClusterToken string

	// ListenMetricsURLs serve /metrics and the health endpoints
	// (--listen-metrics-urls; https ones with the client TLS).
	ListenMetricsURLs []string
	// EnablePprof serves Go's runtime profiles on the client URLs under
	// /debug/pprof/ (--enable-pprof).
	EnablePprof bool
	// Sockets are the socket options of every listener
	// (--socket-reuse-port, --socket-reuse-address).
	Sockets transport.ListenConfig
	// ListenClientHTTPURLs serve HTTP alone, the client URLs then gRPC
	// alone (--listen-client-http-urls); DisableGRPCGateway is
	// --enable-grpc-gateway=false (server.ClientConfig).
	ListenClientHTTPURLs []string
	DisableGRPCGateway   bool
	// CORS and HostWhitelist are --cors and --host-whitelist
	// (server.AccessControl).
	CORS, HostWhitelist []string
	// MaxConcurrentStreams and the GRPCKeepAlive* durations are etcd's
	// --max-concurrent-streams and --grpc-keepalive-* (server.Limits).
	MaxConcurrentStreams                                              uint32
	GRPCKeepAliveMinTime, GRPCKeepAliveInterval, GRPCKeepAliveTimeout time.Duration
	// DisablePreVote is --pre-vote=false (node.Config); MaxLearners and
	// NoStrictReconfig are --max-learners and --strict-reconfig-check=false
	// (membership.Config).
	DisablePreVote   bool
	MaxLearners      int
	NoStrictReconfig bool
	// CompactionBatchLimit and CompactionSleepInterval are etcd's
	// --compaction-batch-limit and --compaction-sleep-interval
	// (mvcc.Options.CompactChunk, CompactPause).
	CompactionBatchLimit    int
	CompactionSleepInterval time.Duration
	// WarningUnaryRequestDuration is --warning-unary-request-duration
	// (server.RequestStatsOptions; 0: etcd's 300ms), WarningApplyDuration
	// --warning-apply-duration (apply.Config; 0: etcd's 100ms).
	WarningUnaryRequestDuration, WarningApplyDuration time.Duration

	AutoCompactionMode      string
	AutoCompactionRetention string

	QuotaBackendBytes int64
	MaxRequestBytes   int
	MaxTxnOps         int
	SnapshotCount     uint64
	// CatchUpEntries are kept in the log below the compaction point.
	CatchUpEntries uint64
	// LoggerRetention (--logger-retention) keeps the raft log until the
	// cluster's strata loggers hold it (node.Config.LogRetention,
	// membership.LoggerWatch; docs/logger.md, "Log retention").
	LoggerRetention bool
	// LoggerTruncate (--logger-truncate) sends the loggers this voter's
	// Truncate request at its engine's durable index as it advances
	// (membership.LoggerWatch).
	LoggerTruncate    bool
	HeartbeatInterval time.Duration
	ElectionTimeout   time.Duration
	// Engine names the storage engine (engines.Names; "" means Pebble),
	// chosen at bootstrap and recorded in the data directory: a restart with
	// another is refused.
	Engine string
	// EngineWAL turns the engine's own WAL on, synced per apply batch: the
	// double-logging baseline of seed 002.
	EngineWAL bool
	// WatchProgressNotifyInterval is etcd's --watch-progress-notify-interval
	// (0: 10 minutes).
	WatchProgressNotifyInterval time.Duration
	// TLS and Auth are etcd's security flags (package tlsconfig, auth.Open).
	TLS  tlsconfig.Config
	Auth auth.Flags
	// InitialCorruptCheck and CorruptCheckTime are etcd's corruption
	// checks (--experimental-initial-corrupt-check, --corrupt-check-time;
	// 0: no periodic check); see package maintenance.
	InitialCorruptCheck bool
	CorruptCheckTime    time.Duration
	// LogCompaction configures log compaction and recovery.
	LogCompaction logcompact.Config
	// Backup configures backups: the continuous mode and the member's own
	// target (--backup-*, --s3-*; package backup, docs/backup.md).
	Backup backup.Options

	Logger *zap.Logger
}
