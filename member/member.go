// Package member wires one strata member together: it opens the data
// directory (package datadir; locked against a second process), the engine,
// the MVCC store, the raft log, the raft node, the applier, the lessor and
// the watch hub, serves etcd's gRPC API (and HTTP) on the client URLs and
// the raft transport on the peer URLs. cmd/strata turns flags into a Config
// and calls Start; the end-to-end tests do the same through the binary.
//
// # Goroutines
//
// Start launches the node goroutine (raft), the applier goroutine, the gRPC
// and peer servers, the lessor, the watch hub and the background loops
// (auto-compaction, attribute publishing, removal watch); Stop ends them and
// closes the stores. A storage failure in the node or the applier is fatal: Done
// closes and Err reports it, and the process must exit.
package member

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/engines"
	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/logger"
	"github.com/strata-kv/strata/maintenance"
	"github.com/strata-kv/strata/membership"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/node"
	"github.com/strata-kv/strata/propose"
	"github.com/strata-kv/strata/raftlog"
	"github.com/strata-kv/strata/server"
	"github.com/strata-kv/strata/snapshot"
	"github.com/strata-kv/strata/transport"
	"github.com/strata-kv/strata/watch"
)

// Member is a running strata member. It is the server.Backend of its own
// gRPC services through the embedded server.Local.
type Member struct {
	*server.Local

	cfg    Config
	logger *zap.Logger

	lock    io.Closer
	engine  engine.Transferable
	store   *mvcc.Store
	log     *raftlog.Log
	node    *node.Node
	applier *apply.Applier
	lessor  *lease.Lessor
	// transport carries the node's messages (node.Outgoing) to peers;
	// tracker keeps its peers equal to the member list.
	transport *transport.Transport
	tracker   *membership.Tracker
	compactor *mvcc.AutoCompactor // nil unless auto-compaction is on
	api       *server.API         // the client and metrics URLs
	peers     *transport.PeerServer

	memberID  uint64
	clusterID uint64
	// proposer proposes requests for the server, the lessor and the
	// auto-compactor, and waits for their results.
	proposer *propose.Proposer

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	done     chan struct{} // closed by the first of Stop and a fatal error
	doneOnce sync.Once
	errMu    sync.Mutex
	err      error

	watchHub *watch.Hub
	backups  *backup.Service
	// catchUp is the snapshot receiver under --catch-up-logger; nil
	// without it.
	catchUp    *loggerFirst
	maintainer *maintenance.Maintainer
	// membership serves the Cluster API and MoveLeader; remote asks the
	// peers for the member list.
	membership *membership.Service
	remote     *membership.Peers
	authStore  *auth.Store
	metrics    *server.Metrics
}

// Start opens the data directory, recovers, and serves clients.
func Start(cfg Config) (_ *Member, err error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.FS == nil {
		cfg.FS = vfs.Default
	}
	if len(cfg.LogDirs) == 0 {
		cfg.LogDirs = []string{datadir.Log(cfg.DataDir)}
	}
	m := &Member{cfg: cfg, logger: cfg.Logger, done: make(chan struct{})}
	defer func() {
		if err != nil {
			if m.peers != nil {
				m.peers.Close()
			}
			if m.api != nil {
				m.api.Close()
			}
			if m.transport != nil {
				m.transport.Stop()
			}
			m.closeStores()
		}
	}()
	// The directories must survive a power cut as surely as the files in
	// them: a data directory whose entry in its parent was never synced
	// comes back empty, and the member would bootstrap a new cluster.
	for _, dir := range append([]string{cfg.DataDir, datadir.Engine(cfg.DataDir)}, cfg.LogDirs...) {
		if err := datadir.MkdirAllSynced(cfg.FS, dir); err != nil {
			return nil, fmt.Errorf("cannot access data directory: %w", err)
		}
	}
	lock, err := cfg.FS.Lock(datadir.Lock(cfg.DataDir))
	if err != nil {
		return nil, fmt.Errorf("data directory %s is in use by another process (lock: %w)", cfg.DataDir, err)
	}
	m.lock = lock

	// Discovery before the identity: the identity of a new member is
	// derived from the cluster discovery returns. etcd's rules: discovery
	// only bootstraps, so beside --initial-cluster-state=existing on an
	// empty data directory it is refused, and on a data directory that
	// holds a member it is ignored.
	ranDiscovery := false
	if cfg.Discover != nil {
		_, initialized, err := datadir.ReadID(cfg.FS, cfg.DataDir)
		switch {
		case err != nil:
			return nil, err
		case !initialized && cfg.InitialClusterState == "existing":
			return nil, errors.New("discovery URL should not be set when joining existing initial cluster")
		case !initialized:
			if cfg.InitialCluster, err = cfg.Discover(); err != nil {
				return nil, err
			}
			ranDiscovery = true
		}
	}
	id, discovered, err := membership.LoadIdentity(cfg.FS, cfg.DataDir, cfg.Engine, cfg.InitialClusterState, cfg.InitialClusterToken,
		membership.JoinConfig{Name: cfg.Name, InitialCluster: cfg.InitialCluster, AdvertisePeerURLs: cfg.AdvertisePeerURLs,
			PeerTLS: cfg.TLS.Peer, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	if id.Removed {
		return nil, membership.ErrRemoved
	}
	m.memberID, m.clusterID = id.MemberID, id.ClusterID
	m.metrics = server.NewMetrics()
	joined := id.Joined

	minTTL := lease.MinTTL(cfg.HeartbeatInterval, cfg.ElectionTimeout)
	m.engine, err = engines.Open(cfg.Engine, datadir.Engine(cfg.DataDir), engines.Options{
		FS: cfg.FS, EnableWAL: cfg.EngineWAL, Logger: cfg.Logger.Named("engine"),
	})
	if err != nil {
		return nil, fmt.Errorf("open engine: %w", err)
	}
	// Only the store's writes are timed; reads pass straight through.
	m.store, err = mvcc.Open(engine.WithCommitTimer(m.engine, m.metrics), mvcc.Options{Logger: cfg.Logger.Named("mvcc"),
		CompactChunk: cfg.CompactionBatchLimit, CompactPause: cfg.CompactionSleepInterval})
	if err != nil {
		return nil, fmt.Errorf("open mvcc store: %w", err)
	}
	openStart := time.Now()
	m.log, err = raftlog.Open(raftlog.Options{FS: cfg.FS, Dirs: cfg.LogDirs, Logger: cfg.Logger.Named("raftlog"),
		SegmentSize: cfg.LogCompaction.SegmentSize})
	if err != nil {
		return nil, fmt.Errorf("open raft log: %w", err)
	}
	logOpen := time.Since(openStart)
	// A member joining with an empty log copies the logger's whole log
	// (refused if the logger lacks any of it: the member would start empty
	// and get a snapshot anyway, which the operator asked to avoid). A
	// member restarting on its log copies what it missed while down; if
	// the logger does not hold that, it starts and the leader sends it
	// what it needs, as without the flag.
	lastIndex, err := m.log.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("open raft log: %w", err)
	}
	var caughtUpTo uint64 // the last entry copied from the logger, for the node to tell the leader
	if cfg.CatchUpLogger != "" && (joined || lastIndex > 0) {
		res, err := logger.CatchUpTLS(context.Background(), cfg.CatchUpLogger, cfg.TLS.Client.ForwardConfig(cfg.Logger), m.clusterID, m.log)
		switch {
		case err != nil && lastIndex > 0 && errors.Is(err, logger.ErrCatchUp):
			cfg.Logger.Warn("cannot catch up from the logger; the leader will send what this member lacks", zap.String("logger", cfg.CatchUpLogger), zap.Error(err))
		case err != nil:
			return nil, err
		default:
			caughtUpTo = res.Last
			cfg.Logger.Info("caught up from the logger", zap.String("logger", cfg.CatchUpLogger), zap.Uint64("entries", res.Entries), zap.Uint64("last-index", res.Last))
		}
	}
	m.store.Start()
	// Recovery replays compacted batches before raft starts, with an
	// applier that has only the auth store attached (it decides kept lease
	// requests as they were decided live): no lessor (replay writes lease
	// records itself), no node, no waiting client. The applier that runs
	// is built once the node and the lessor exist, and reads the state
	// recovery left.
	if m.authStore, err = auth.Open(cfg.Auth, m.engine, cfg.Logger.Named("auth")); err != nil {
		return nil, err
	}
	m.applier, err = apply.New(apply.Config{Store: m.store, Auth: m.authStore, MaxLearners: cfg.MaxLearners, Logger: cfg.Logger.Named("apply")})
	if err != nil {
		return nil, fmt.Errorf("open applier for recovery: %w", err)
	}
	recovery, err := logcompact.Recover(cfg.LogCompaction, m.log, m.store, m.applier, minTTL, cfg.Logger)
	if err != nil {
		return nil, err
	}
	var peers []raft.Peer
	last, _ := m.log.LastIndex()
	if cfg.Discover != nil && !ranDiscovery {
		if last == 0 && !joined {
			// The identity was recorded but the member crashed before its
			// first entries: ask again for the cluster the identity was
			// derived from (this member's registration is still there).
			if cfg.InitialCluster, err = cfg.Discover(); err != nil {
				return nil, err
			}
			again, err := datadir.BootstrapID(cfg.Name, cfg.InitialCluster, cfg.InitialClusterToken)
			if err != nil {
				return nil, err
			}
			if again.ClusterID != m.clusterID || again.MemberID != m.memberID {
				return nil, fmt.Errorf("discovery returned cluster %x (member %x), but the data directory records cluster %x (member %x): use a new token and an empty data directory",
					again.ClusterID, again.MemberID, m.clusterID, m.memberID)
			}
		} else {
			cfg.Logger.Warn("discovery token is ignored since cluster already initialized; valid logs are found", zap.String("data-dir", cfg.DataDir))
		}
	}
	if last == 0 && !joined {
		peers, err = membership.BootstrapPeers(cfg.InitialCluster, cfg.InitialClusterToken)
		if err != nil {
			return nil, err
		}
	}
	tick := cfg.HeartbeatInterval
	electionTicks := int(cfg.ElectionTimeout / tick)
	// incoming counts the client API's writes on their way to the node,
	// whose group commit waits for them (node/incoming.go).
	incoming := &node.Incoming{}
	m.node, err = node.New(node.Config{
		ID:             m.memberID,
		Peers:          peers,
		Join:           joined,
		Log:            m.log,
		Engine:         m.engine,
		Applied:        m.applier.AppliedIndex(),
		ConfState:      m.applier.ConfState(),
		TickInterval:   tick,
		ElectionTicks:  max(electionTicks, 2),
		HeartbeatTicks: 1,
		SnapshotCount:  cfg.SnapshotCount,
		CatchUpEntries: cfg.CatchUpEntries,
		SnapshotBytes:  cfg.SnapshotBytes,
		CatchUpBytes:   cfg.CatchUpBytes,
		DisablePreVote: cfg.DisablePreVote,
		LogRetention:   cfg.LoggerRetention,
		MatchedIndex:   caughtUpTo,
		Incoming:       incoming,
		// The forced entries are appended and synced by New, before the
		// node, the applier or any client API runs.
		ForceNewCluster: cfg.ForceNewCluster,
		ClusterID:       m.clusterID,
		ServerLogger:    cfg.Logger,
		Logger:          cfg.Logger.Named("raft"),
	})
	if err != nil {
		return nil, fmt.Errorf("start raft node: %w", err)
	}
	waiters, alarms := apply.NewWaiters(), &apply.Alarms{}
	m.proposer = propose.New(propose.Config{
		MemberID:  m.memberID,
		Raft:      m.node,
		LastIndex: m.log.LastIndex,
		Applied:   m.store,
		Waiters:   waiters,
		Quota: &propose.Quota{
			Bytes: cfg.QuotaBackendBytes, DiskSize: m.engine.DiskSize, Alarms: alarms, Logger: cfg.Logger.Named("quota"),
		},
		Metrics: m.metrics,
		Stopped: m.done,
	})
	snaps := snapshot.NewSnapshotter(snapshot.Config{
		Dir: datadir.Snap(cfg.DataDir), FS: cfg.FS, Engine: m.engine, Store: m.store, Log: m.log, Raft: m.node,
		LeaseMinTTL: minTTL, Registry: m.metrics.Registry(), Logger: cfg.Logger.Named("snapshot"),
	})
	m.lessor = lease.New(lease.Config{
		MinTTL:          minTTL,
		ElectionTimeout: cfg.ElectionTimeout,
		Raft:            m.proposer,
		Proposer:        m.proposer,
		RequestTimeout:  server.RequestTimeout(cfg.ElectionTimeout),
		Logger:          cfg.Logger.Named("lease"),
	})
	if err := m.lessor.Load(m.store); err != nil {
		return nil, err
	}
	m.watchHub = watch.New(m.store, watch.Options{
		ProgressInterval: cfg.WatchProgressNotifyInterval, Logger: cfg.Logger.Named("watch"),
	})
	m.applier, err = apply.New(apply.Config{
		Store:     m.store,
		Progress:  m.node,
		Waiters:   waiters,
		Alarms:    alarms,
		Lessor:    m.lessor,
		Auth:      m.authStore,
		Installer: snaps,
		Notifier:  m.watchHub,
		Logger:    cfg.Logger.Named("apply"),

		MaxLearners:       cfg.MaxLearners,
		WarnApplyDuration: cfg.WarningApplyDuration,
	})
	if err != nil {
		return nil, fmt.Errorf("open applier: %w", err)
	}

	m.compactor, err = mvcc.NewAutoCompaction(cfg.AutoCompactionMode, cfg.AutoCompactionRetention, mvcc.AutoCompactOptions{
		Store: m.store, Proposer: m.proposer, RequestTimeout: server.RequestTimeout(cfg.ElectionTimeout),
		Logger: cfg.Logger.Named("autocompact"),
	})
	if err != nil {
		return nil, err
	}
	m.Local = &server.Local{
		ID: m.memberID, Cluster: m.clusterID,
		Proposer: m.proposer, Raft: m.node, Applier: m.applier, StateMachine: m.store, Engine: m.engine,
	}
	peerCreds, peerTLS, err := cfg.TLS.PeerServing(cfg.ListenPeerURLs, cfg.AdvertisePeerURLs)
	if err != nil {
		return nil, err
	}
	var snapshotter transport.Snapshotter = snaps
	if cfg.CatchUpLogger != "" {
		// A running member behind the leader's log catches up from the
		// logger before it takes a snapshot (member/catchup.go).
		m.catchUp = &loggerFirst{Snapshotter: snaps, node: m.node, endpoint: cfg.CatchUpLogger,
			tls: cfg.TLS.Client.ForwardConfig(cfg.Logger), clusterID: m.clusterID, logger: cfg.Logger.Named("catch-up")}
		snapshotter = m.catchUp
	}
	m.transport = transport.New(transport.Config{
		TLS: peerTLS, LocalID: m.memberID, ClusterID: m.clusterID, Handler: snaps.Reports(m.node), Snapshotter: snapshotter,
		Outgoing: m.node.Outgoing(), Logger: cfg.Logger.Named("transport"),
	})
	m.remote = &membership.Peers{MemberID: m.memberID, ClusterID: m.clusterID, Members: m.applier,
		TLS: cfg.TLS.Peer, Logger: cfg.Logger.Named("membership")}
	members := m.applier.Members()
	if len(members) == 0 {
		members = discovered // a joining member's, until its log arrives
	}
	m.node.KeepLogFor(membership.LoggerIDs(members))
	m.tracker = membership.NewTracker(membership.TrackerConfig{MemberID: m.memberID, Transport: m.transport},
		members, m.applier.Removed())
	m.membership = membership.New(membership.Config{
		MemberID: m.memberID, ClusterID: m.clusterID, Token: cfg.InitialClusterToken, Timeout: server.RequestTimeout(cfg.ElectionTimeout),
		Members: m.applier, Raft: m.node, Proposer: m.proposer, Activity: m.transport, Peers: m.remote,
		ClientTLS: cfg.TLS.Client, MaxLearners: cfg.MaxLearners, NoStrictReconfig: cfg.NoStrictReconfig,
		Logger: cfg.Logger.Named("membership"),
	})
	m.maintainer = maintenance.New(maintenance.Config{
		MemberID: m.memberID, ClusterID: m.clusterID,
		Engine: m.engine, Store: m.store, State: m.applier, Raft: m, Proposer: m.proposer,
		PeerTLS: cfg.TLS.Peer, TempDir: datadir.SnapshotTemp(cfg.FS, cfg.DataDir),
		SeekReads:           engines.SeeksCheaperThanGets(cfg.Engine),
		InitialCorruptCheck: cfg.InitialCorruptCheck, CorruptCheckTime: cfg.CorruptCheckTime,
		Logger: cfg.Logger.Named("maintenance"),
	})
	m.backups, err = backup.OpenService(backup.ServiceConfig{
		Options: cfg.Backup, Engine: m.engine, ID: id, Term: m.log.Term, StagingDir: datadir.BackupStaging(cfg.DataDir),
		Log: m.log, Applied: m.applier, FS: cfg.FS, Raft: m.node, MemberID: m.memberID,
		Logger: cfg.Logger.Named("backup"),
	})
	if err != nil {
		return nil, err
	}
	m.metrics.Registry().MustRegister(backup.NewCollector(m.backups.Stats))
	m.api, err = server.NewAPI(server.APIConfig{
		Options: cfg.Client, ListenURLs: cfg.ListenClientURLs, Sockets: cfg.Sockets, TLS: cfg.TLS.Client, PeerTLS: cfg.TLS.Peer,
		ElectionTimeout: cfg.ElectionTimeout, QuotaBackendBytes: cfg.QuotaBackendBytes,
		Backend: m, Auth: m.authStore, Lessor: m.lessor, Watches: m.watchHub, Maintainer: m.maintainer,
		Admin: m.membership, Services: []server.Registrar{m.backups}, Incoming: incoming, Metrics: m.metrics,
		Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	m.peers, err = transport.NewPeerServer(transport.PeerServerConfig{URLs: cfg.ListenPeerURLs, Sockets: cfg.Sockets,
		Creds: peerCreds, Transport: m.transport, Services: []transport.PeerService{m.api, m.maintainer}})
	if err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.watchHub.Start()
	m.run(func() {
		if err := m.node.Run(ctx); err != nil {
			m.fail(fmt.Errorf("raft node: %w", err))
		}
	})
	m.run(func() {
		if err := m.applier.Run(ctx, m.node.Committed()); err != nil {
			m.fail(fmt.Errorf("applier: %w", err))
		}
	})
	m.run(func() { m.dispatchOutcomes(ctx) })
	m.metrics.Registry().MustRegister(server.NewStateCollector(server.StateSource{
		MemberID: m.memberID, Raft: m.node, Applier: m.applier, Store: m.store, Engine: m.engine, Log: m.log,
	}))
	if c, ok := m.engine.(prometheus.Collector); ok { // the engine's own metrics (Pebble's)
		m.metrics.Registry().MustRegister(c)
	}
	if prober, err := transport.NewProber(transport.ProberConfig{
		LocalID: m.memberID, Members: m.applier, TLS: cfg.TLS.Peer,
		Registry: m.metrics.Registry(), Logger: cfg.Logger.Named("probe"),
	}); err != nil {
		m.logger.Warn("peer round-trip times not measured", zap.Error(err))
	} else {
		m.run(func() { prober.Run(ctx) })
	}
	m.api.Serve(ctx)
	m.peers.Serve()
	m.run(func() { m.membership.PublishAttributes(ctx, cfg.Name, cfg.AdvertiseClientURLs) })
	m.run(func() { m.tracker.Run(ctx) })
	watchCfg := membership.LoggerWatchConfig{ClusterID: m.clusterID, MemberID: m.memberID,
		Members: m.applier, TLS: cfg.TLS.Client.ForwardConfig(cfg.Logger), Logger: cfg.Logger.Named("loggers")}
	if cfg.Backup.Target != "" {
		// The loggers keep the log after the newest backup version
		// (docs/logger.md, "Truncation at a backup version").
		watchCfg.Backed = m.backups.VersionIndex
	}
	if w := membership.NewMemberLoggerWatch(watchCfg, cfg.LoggerRetention, m.node, cfg.LoggerTruncate, m.engine.DurableIndex); w != nil {
		m.run(func() { w.Run(ctx) })
	}
	m.run(func() {
		select {
		case <-m.tracker.Removed():
			removed := id
			removed.Removed = true
			if err := datadir.WriteID(cfg.FS, cfg.DataDir, removed); err != nil {
				m.logger.Warn("cannot record the removal in the data directory; a restart will idle", zap.Error(err))
			}
			m.fail(membership.ErrRemoved)
		case <-ctx.Done():
		}
	})
	if m.compactor != nil {
		m.compactor.Run()
	}
	m.run(func() {
		if err := m.maintainer.Run(ctx); err != nil {
			m.fail(err)
		}
	})
	var retention logcompact.Retention // nil: no logger holds compaction back
	if cfg.LoggerRetention {
		retention = m.node
	}
	compactor := logcompact.NewCompactor(logcompact.CompactorConfig{
		Config: cfg.LogCompaction, Log: m.log, Store: m.store, Applied: m.applier,
		CatchUpEntries: cfg.CatchUpEntries, Retention: retention, Logger: cfg.Logger.Named("logcompact"),
	})
	m.run(func() {
		recovery.AwaitReplay(ctx, m.log, m.applier, logOpen, cfg.Logger)
		// Built beside the replay, the filter would slow it down.
		if ctx.Err() == nil {
			m.store.StartKeyFilter()
		}
	})
	m.run(func() { compactor.Run(ctx) })
	m.run(func() { m.lessor.Run(ctx) })
	m.run(func() { m.backups.Run(ctx) })
	m.logger.Info("strata member started",
		zap.String("name", cfg.Name),
		zap.String("member-id", fmt.Sprintf("%x", m.memberID)),
		zap.String("cluster-id", fmt.Sprintf("%x", m.clusterID)),
		zap.Uint64("applied-index", m.applier.AppliedIndex()),
		zap.Int64("revision", m.store.Rev()),
		zap.Strings("client-urls", cfg.ListenClientURLs))
	return m, nil
}

// run runs f on a goroutine that Stop waits for.
func (m *Member) run(f func()) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
}

// dispatchOutcomes acts on what the applier did, in order: the tracker
// learns the membership (the transport's peers follow it, and a member that
// finds itself removed stops), and the node the loggers it keeps its log
// for (--logger-retention).
// (The node learns the applied index from the applier itself, its
// Progress, without waiting for this loop.)
func (m *Member) dispatchOutcomes(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-m.applier.Outcomes():
			if o.Members != nil {
				m.tracker.Changed(o.Members, o.Removed)
				m.node.KeepLogFor(membership.LoggerIDs(o.Members))
			}
		}
	}
}

// WaitReady blocks until the member has a leader and has applied what was
// committed before it started, or ctx ends.
func (m *Member) WaitReady(ctx context.Context) error {
	return m.ReadBarrier(ctx)
}

// Done is closed when the member has stopped, by Stop or by a fatal error.
func (m *Member) Done() <-chan struct{} { return m.done }

// Err returns the fatal error that stopped the member, if any.
func (m *Member) Err() error {
	m.errMu.Lock()
	defer m.errMu.Unlock()
	return m.err
}

func (m *Member) fail(err error) {
	m.errMu.Lock()
	if m.err == nil {
		m.err = err
		m.logger.Error("fatal error, stopping member", zap.Error(err))
	}
	m.errMu.Unlock()
	m.cancel()
	m.doneOnce.Do(func() { close(m.done) })
}

// Stop stops serving, stops raft and the applier, flushes the engine so
// that the next start replays little, and closes the data directory.
func (m *Member) Stop() error {
	// Watch streams never end by themselves: end them first, so that the
	// graceful stop does not wait for them.
	m.watchHub.Close()
	if m.api != nil {
		m.api.Stop()
	}
	if m.peers != nil {
		m.peers.Stop()
	}
	if m.compactor != nil {
		m.compactor.Stop()
	}
	m.cancel()
	m.wg.Wait()
	m.backups.Close()
	if m.api != nil {
		m.api.Wait()
	}
	if m.maintainer != nil {
		m.maintainer.Wait()
	}
	if m.transport != nil {
		m.transport.Stop()
	}
	if m.catchUp != nil {
		m.catchUp.close()
	}
	m.doneOnce.Do(func() { close(m.done) })
	var errs []error
	if m.Err() == nil {
		if err := m.engine.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("flush engine: %w", err))
		}
	}
	errs = append(errs, m.closeStores())
	return errors.Join(errs...)
}

func (m *Member) closeStores() error {
	var errs []error
	if m.store != nil {
		errs = append(errs, m.store.Close())
	}
	if m.log != nil {
		errs = append(errs, m.log.Close())
	}
	if m.engine != nil {
		errs = append(errs, m.engine.Close())
	}
	if m.lock != nil {
		errs = append(errs, m.lock.Close())
	}
	return errors.Join(errs...)
}
