package member

import (
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/server"
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
	// Discover, if set, is etcd's v3 discovery (--discovery-token, package
	// discovery): it registers this member and returns the cluster to
	// bootstrap, which replaces InitialCluster (then only this member's
	// entry); InitialClusterToken must be the discovery token, from which
	// etcd derives the IDs. Start calls it only while the member has no
	// cluster yet: on an empty data directory, and again on one whose raft
	// log is still empty (a crash after the identity was recorded), where a
	// registered member gets the same cluster back. It may block until the
	// cluster's size have registered.
	Discover func() (map[string][]string, error)
	// ForceNewCluster is etcd's --force-new-cluster: a member restarted on
	// its data directory becomes the only member of its cluster, keeping
	// its member ID, cluster ID and committed data (node.Config). On an
	// empty data directory it has no effect, as in etcd.
	ForceNewCluster bool

	// Sockets are the socket options of every listener
	// (--socket-reuse-port, --socket-reuse-address).
	Sockets transport.ListenConfig
	// Client holds the flags only the client API reads (server.NewAPI).
	Client server.ClientOptions
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
	// WarningApplyDuration is --warning-apply-duration (apply.Config; 0:
	// etcd's 100ms).
	WarningApplyDuration time.Duration

	AutoCompactionMode      string
	AutoCompactionRetention string

	QuotaBackendBytes int64
	SnapshotCount     uint64
	// CatchUpEntries are kept in the log below the compaction point.
	CatchUpEntries uint64
	// SnapshotBytes and CatchUpBytes are node.Config's: the truncation
	// schedule in bytes beside SnapshotCount and CatchUpEntries (0: the
	// node's defaults).
	SnapshotBytes, CatchUpBytes uint64
	// The strata logger flags (docs/logger.md): LoggerRetention
	// (--logger-retention) keeps the raft log until the loggers hold it
	// (node.Config.LogRetention); LoggerTruncate (--logger-truncate) asks
	// them to truncate at the engine's durable index; CatchUpLogger
	// (--catch-up-logger) fills a joining member's empty log from that
	// logger (logger.CatchUp), so the leader sends it no snapshot.
	LoggerRetention, LoggerTruncate bool
	CatchUpLogger                   string
	HeartbeatInterval               time.Duration
	ElectionTimeout                 time.Duration
	// Engine names the storage engine (engines.Names; "": Pebble), recorded
	// in the data directory at bootstrap; EngineWAL turns its own WAL on,
	// synced per apply batch (seed 002's double-logging baseline).
	Engine    string
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
