package logger

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/membership/memberlist"
	"github.com/strata-kv/strata/raftlog"
	"github.com/strata-kv/strata/tlsconfig"
	"github.com/strata-kv/strata/transport"
)

// Errors of the logger's data directory and joining.
var (
	// ErrAlreadyJoined means the data directory already holds the cluster.
	ErrAlreadyJoined = errors.New("logger: cluster already joined")
	// ErrLocked means another process holds the data directory.
	ErrLocked = errors.New("logger: data directory in use by another process")
)

// Config configures a Logger.
type Config struct {
	// DataDir holds the LOCK and one directory per cluster.
	DataDir string
	// ListenPeerURLs are where members' peer streams arrive, for every
	// cluster; AdvertisePeerURLs are the URLs the clusters know the logger
	// by (the --peer-urls of `etcdctl member add --learner`).
	ListenPeerURLs, AdvertisePeerURLs []string
	// ListenClientURLs serve the logger API (Status, Recover).
	ListenClientURLs []string
	// AdvertiseClientURLs are the logger's client URLs as it publishes
	// them in each cluster's member list, with the logger's marker path
	// (memberlist.LoggerURLPath). Empty: ListenClientURLs.
	AdvertiseClientURLs []string
	// TickInterval is the learners' raft tick. 0: 100 ms.
	TickInterval time.Duration
	// ScanInterval is how often the logger looks for clusters that
	// `strata logger join` added. 0: 1 s.
	ScanInterval time.Duration
	// SegmentSize is the preallocated size of the logs' segments. 0:
	// raftlog.DefaultSegmentSize.
	SegmentSize int64
	// HealthTimeout is how recently every cluster's learner must have
	// heard from a leader for /health to answer true. 0: 3 s.
	HealthTimeout time.Duration
	// TLS secures the URLs, in etcd's terms (tlsconfig; the --cert-file,
	// --key-file, --trusted-ca-file, --client-cert-auth flags and their
	// --peer-* twins): https client URLs serve the logger API and
	// /metrics, /health with TLS.Client; https peer URLs serve the
	// members' streams with TLS.Peer, and the learners dial members'
	// https peer URLs with it.
	TLS tlsconfig.Config
	// LogCompaction, if Enabled, compacts each cluster's log with
	// strata's log compaction (compaction.go; --log-compaction,
	// --log-compaction-batch, --history, --log-segment-size as members
	// take them). Its SegmentSize is ignored: SegmentSize is the logs'.
	LogCompaction logcompact.Config
	// FS is the file system. nil: vfs.Default.
	FS vfs.FS
	// Now is the clock of /health and the metrics. nil: time.Now.
	Now    func() time.Time
	Logger *zap.Logger
}

// Logger hosts one raft learner per cluster it joined (docs/logger.md).
//
// Concurrency: Open starts nothing. Start starts the peer and client gRPC
// servers (one goroutine each per listener), one goroutine per learner,
// and the scan goroutine that opens clusters added by Join; Close ends them
// all and waits for them. Status and Recover are safe from any goroutine.
//
// Invariants:
//  1. The data directory is locked from Open to Close: one logger per
//     directory.
//  2. Each cluster has exactly one learner, one raftlog and one Transport,
//     registered in the Mux under its cluster ID, from its open until
//     Close.
type Logger struct {
	cfg Config
	// markedURLs are the client URLs the learners publish (marker.go).
	markedURLs []string
	lg         *zap.Logger
	fs         vfs.FS
	lock       io.Closer
	mux        *transport.Mux
	// peerTLS dials the members' peer URLs (nil: plaintext);
	// peerCreds and clientTLS serve the peer and client URLs (nil:
	// plaintext). Set by Open.
	peerTLS   *tls.Config
	peerCreds []grpc.ServerOption
	clientTLS *tls.Config

	peerGRPC, clientGRPC *grpc.Server
	listeners            []net.Listener
	// clientHTTP serves /metrics and /health on the client URLs, beside
	// the API (splits route each connection).
	clientHTTP *http.Server
	splits     []*transport.SplitListener

	ctx    context.Context // Start's, cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	failc  chan error // a learner's fatal error (a failed write)

	mu struct {
		sync.Mutex
		clusters map[uint64]*cluster
		started  bool
	}
}

// cluster is one cluster the logger serves.
type cluster struct {
	rec *ClusterRecord
	dir string
	log *raftlog.Log
	tr  *transport.Transport
	ln  *learner
	// comp compacts the log; nil without Config.LogCompaction.Enabled.
	comp *compactor

	// trunc serialises Truncate requests and their record.
	trunc struct {
		sync.Mutex
		requests map[uint64]uint64 // voter -> highest index it asked
	}
}

// Open locks the data directory and opens (recovers) the log of every
// cluster in it. It starts nothing.
func Open(cfg Config) (*Logger, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("logger: no data directory")
	}
	if cfg.FS == nil {
		cfg.FS = vfs.Default
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.TickInterval <= 0 {
		cfg.TickInterval = 100 * time.Millisecond
	}
	if cfg.ScanInterval <= 0 {
		cfg.ScanInterval = time.Second
	}
	if cfg.HealthTimeout <= 0 {
		cfg.HealthTimeout = defaultHealthTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	advertise := cfg.AdvertiseClientURLs
	if len(advertise) == 0 {
		advertise = cfg.ListenClientURLs
	}
	var marked []string
	for _, u := range advertise {
		m, err := memberlist.MarkLoggerURL(u)
		if err != nil {
			return nil, fmt.Errorf("logger: %w", err)
		}
		marked = append(marked, m)
	}
	// Every TLS refusal before the data directory is touched.
	peerCreds, peerTLS, err := cfg.TLS.PeerServing(cfg.ListenPeerURLs, cfg.AdvertisePeerURLs)
	if err != nil {
		return nil, fmt.Errorf("logger: %w", err)
	}
	var clientTLS *tls.Config
	if secure, err := tlsconfig.URLsSecure("--listen-client-urls", cfg.ListenClientURLs); err != nil {
		return nil, fmt.Errorf("logger: %w", err)
	} else if secure {
		if clientTLS, err = cfg.TLS.Client.ServerConfig(); err != nil {
			return nil, fmt.Errorf("logger: --listen-client-urls: %w", err)
		}
	}
	if err := datadir.MkdirAllSynced(cfg.FS, clustersDir(cfg.DataDir)); err != nil {
		return nil, fmt.Errorf("logger: create data directory %s: %w", cfg.DataDir, err)
	}
	lock, err := cfg.FS.Lock(lockPath(cfg.DataDir))
	if err != nil {
		return nil, fmt.Errorf("%w: %s (lock: %v)", ErrLocked, cfg.DataDir, err)
	}
	l := &Logger{cfg: cfg, markedURLs: marked, lg: cfg.Logger, fs: cfg.FS, lock: lock, mux: transport.NewMux(), failc: make(chan error, 1),
		peerTLS: peerTLS, peerCreds: peerCreds, clientTLS: clientTLS}
	l.mu.clusters = make(map[uint64]*cluster)
	ids, err := listClusters(cfg.FS, cfg.DataDir)
	if err == nil {
		for _, id := range ids {
			if err = l.openCluster(id); err != nil {
				break
			}
		}
	}
	if err != nil {
		l.closeClusters()
		lock.Close()
		return nil, err
	}
	return l, nil
}

// openCluster opens one cluster's directory: its record, its log
// (recovered), its gap record (reconciled), its transport and learner.
func (l *Logger) openCluster(id uint64) error {
	dir := clusterDir(l.cfg.DataDir, id)
	rec, err := readRecord(l.fs, dir)
	if err != nil {
		return fmt.Errorf("logger: open cluster %x: %w", id, err)
	}
	if rec.ClusterID != id {
		return fmt.Errorf("logger: %s holds cluster %x", dir, rec.ClusterID)
	}
	if len(l.cfg.AdvertisePeerURLs) > 0 && !sameURLs(rec.PeerURLs, l.cfg.AdvertisePeerURLs) {
		l.lg.Warn("the logger joined this cluster with other peer URLs; its members dial those",
			zap.String("cluster-id", fmt.Sprintf("%x", id)), zap.Strings("joined-with", rec.PeerURLs),
			zap.Strings("advertised", l.cfg.AdvertisePeerURLs))
	}
	lg := l.lg.With(zap.String("cluster-id", fmt.Sprintf("%x", id)), zap.String("member-id", fmt.Sprintf("%x", rec.MemberID)))
	log, err := raftlog.Open(raftlog.Options{FS: l.fs, Dirs: []string{filepath.Join(dir, logDirName)}, SegmentSize: l.cfg.SegmentSize, Logger: lg.Named("raftlog")})
	if err != nil {
		return fmt.Errorf("logger: open the raft log of cluster %x: %w", id, err)
	}
	if first, _ := log.FirstIndex(); first > 1 {
		// Compacted batches left below a snapshot point they do not reach
		// (a crash after a snapshot restarted the log and before its
		// batches were dropped: learner.restartAfter) are no part of the
		// log any more.
		if _, cl, n := log.CompactedRange(); n > 0 && cl < first-1 {
			if err := log.Compact(first-1, nil); err != nil && !errors.Is(err, raft.ErrCompacted) {
				log.Close()
				return fmt.Errorf("logger: drop stale compacted batches of cluster %x: %w", id, err)
			}
		}
	}
	requests, err := readTruncations(l.fs, dir)
	var gaps []Gap
	if err == nil {
		gaps, err = readGaps(l.fs, dir)
	}
	if err == nil {
		gaps, err = reconcileGaps(l.fs, dir, log, gaps, truncationPoint(requests, rec.Voters), time.Now())
	}
	if err != nil {
		log.Close()
		return fmt.Errorf("logger: gap and truncation records of cluster %x: %w", id, err)
	}
	inbox := NewInbox()
	inbox.now = l.cfg.Now
	tr := transport.New(transport.Config{
		LocalID:     rec.MemberID,
		ClusterID:   id,
		Handler:     inbox,
		Snapshotter: inbox,
		TLS:         l.peerTLS,
		Logger:      lg.Named("transport"),
	})
	for pid, urls := range rec.Peers {
		tr.AddPeer(pid, urls)
	}
	name := rec.Name
	if name == "" {
		name = fmt.Sprintf("logger-%x", rec.MemberID)
	}
	ln, err := newLearner(learnerConfig{
		Record: rec, Dir: dir, FS: l.fs, Log: log, Gaps: gaps,
		Inbox: inbox, Sender: tr, Peers: tr,
		TickInterval: l.cfg.TickInterval, Logger: lg.Named("learner"),
		Attributes: &Attributes{Name: name, ClientURLs: l.markedURLs},
	})
	if err == nil {
		err = l.mux.Add(tr)
	}
	if err != nil {
		tr.Stop()
		log.Close()
		return fmt.Errorf("logger: cluster %x: %w", id, err)
	}
	c := &cluster{rec: rec, dir: dir, log: log, tr: tr, ln: ln}
	if l.cfg.LogCompaction.Enabled && err == nil {
		c.comp, err = openCompactor(l.cfg.LogCompaction, dir, id, log, lg.Named("logcompact"))
		if err != nil {
			l.mux.Remove(id)
			tr.Stop()
			log.Close()
			return fmt.Errorf("logger: cluster %x: %w", id, err)
		}
		c.comp.ln = ln
	}
	c.trunc.requests = requests
	// A truncation recorded before a crash is done when the learner runs.
	ln.requestTrim(truncationPoint(requests, ln.voters()))
	l.mu.Lock()
	l.mu.clusters[id] = c
	l.mu.Unlock()
	first, _ := log.FirstIndex()
	last, _ := log.LastIndex()
	lg.Info("opened cluster", zap.Uint64("first-index", first), zap.Uint64("last-index", last), zap.Int("gaps", len(gaps)))
	return nil
}

// Start serves the peer URLs (every cluster's peer streams, through the
// Mux) and the client URLs (the logger API), starts every learner, and
// looks for clusters that Join adds every ScanInterval.
func (l *Logger) Start(ctx context.Context) error {
	l.mu.Lock()
	if l.mu.started {
		l.mu.Unlock()
		return errors.New("logger: already started")
	}
	l.mu.started = true
	l.mu.Unlock()
	peerLis, err := transport.Listen("peer", l.cfg.ListenPeerURLs)
	if err != nil {
		return fmt.Errorf("logger: %w", err)
	}
	clientLis, err := transport.Listen("client", l.cfg.ListenClientURLs)
	if err != nil {
		for _, li := range peerLis {
			li.Close()
		}
		return fmt.Errorf("logger: %w", err)
	}
	l.ctx, l.cancel = context.WithCancel(ctx)
	l.peerGRPC = grpc.NewServer(append([]grpc.ServerOption{grpc.MaxRecvMsgSize(1 << 30), grpc.MaxSendMsgSize(1 << 30)}, l.peerCreds...)...)
	l.mux.Register(l.peerGRPC)
	var clientOpts []grpc.ServerOption
	var httpTLS *tls.Config
	if l.clientTLS != nil {
		// As a member's https client URL (server/serve.go): gRPC clients
		// (ALPN h2) do the TLS handshake with the gRPC server, HTTP/1.x
		// ones (/metrics, /health) with the HTTP server.
		clientOpts = append(clientOpts, grpc.Creds(credentials.NewTLS(l.clientTLS)))
		httpTLS = l.clientTLS.Clone()
		httpTLS.NextProtos = []string{"http/1.1"}
	}
	l.clientGRPC = grpc.NewServer(clientOpts...)
	registerAPI(l.clientGRPC, l)
	for _, li := range peerLis {
		l.serve(l.peerGRPC, li)
	}
	l.clientHTTP = &http.Server{Handler: l.httpHandler(), ReadHeaderTimeout: 10 * time.Second}
	for _, li := range clientLis {
		var split *transport.SplitListener
		var httpL net.Listener
		if httpTLS != nil {
			split = transport.NewTLSSplitListener(li, l.lg.Named("listener"))
			httpL = tls.NewListener(split.HTTP(), httpTLS)
		} else {
			split = transport.NewSplitListener(li, l.lg.Named("listener"))
			httpL = split.HTTP()
		}
		l.splits = append(l.splits, split)
		l.serve(l.clientGRPC, split.GRPC())
		l.wg.Add(2)
		go func() {
			defer l.wg.Done()
			_ = l.clientHTTP.Serve(httpL)
		}()
		go func() {
			defer l.wg.Done()
			_ = split.Serve()
		}()
	}
	l.mu.Lock()
	for _, c := range l.mu.clusters {
		l.runLearner(c)
	}
	n := len(l.mu.clusters)
	l.mu.Unlock()
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.scan()
	}()
	l.lg.Info("logger started", zap.Strings("listen-peer-urls", l.cfg.ListenPeerURLs),
		zap.Strings("listen-client-urls", l.cfg.ListenClientURLs), zap.Int("clusters", n))
	return nil
}

func (l *Logger) serve(s *grpc.Server, li net.Listener) {
	l.listeners = append(l.listeners, li)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		_ = s.Serve(li)
	}()
}

// runLearner starts c's learner goroutine.
//
// REQUIRES: l.mu held, Start called.
func (l *Logger) runLearner(c *cluster) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		if err := c.ln.run(l.ctx); err != nil {
			select {
			case l.failc <- fmt.Errorf("cluster %x: %w", c.rec.ClusterID, err):
			default:
			}
		}
	}()
	if c.comp != nil {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			c.comp.run(l.ctx)
		}()
	}
}

// scan opens and starts the clusters Join added, until Close.
func (l *Logger) scan() {
	t := time.NewTicker(l.cfg.ScanInterval)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		ids, err := listClusters(l.fs, l.cfg.DataDir)
		if err != nil {
			l.lg.Warn("cannot list clusters", zap.Error(err))
			continue
		}
		for _, id := range ids {
			l.mu.Lock()
			_, known := l.mu.clusters[id]
			l.mu.Unlock()
			if known {
				continue
			}
			if err := l.openCluster(id); err != nil {
				l.lg.Warn("cannot open a joined cluster", zap.String("cluster-id", fmt.Sprintf("%x", id)), zap.Error(err))
				continue
			}
			l.mu.Lock()
			if l.ctx.Err() == nil {
				l.runLearner(l.mu.clusters[id])
			}
			l.mu.Unlock()
			l.lg.Info("serving a newly joined cluster", zap.String("cluster-id", fmt.Sprintf("%x", id)))
		}
	}
}

// Failed returns a channel that receives a learner's fatal error (a failed
// write or fsync): the process should exit and restart from disk.
func (l *Logger) Failed() <-chan error { return l.failc }

// Clusters returns the IDs of the clusters the logger serves.
func (l *Logger) Clusters() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]uint64, 0, len(l.mu.clusters))
	for id := range l.mu.clusters {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (l *Logger) cluster(id uint64) *cluster {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.clusters[id]
}

// Close stops the servers and the learners, waits for them, closes the logs
// and releases the data directory.
func (l *Logger) Close() error {
	if l.cancel != nil {
		l.cancel()
	}
	for _, split := range l.splits {
		_ = split.Close()
	}
	if l.clientHTTP != nil {
		_ = l.clientHTTP.Close()
	}
	if l.clientGRPC != nil {
		l.clientGRPC.Stop()
	}
	if l.peerGRPC != nil {
		l.peerGRPC.Stop()
	}
	l.mu.Lock()
	for _, c := range l.mu.clusters {
		c.tr.Stop()
	}
	l.mu.Unlock()
	l.wg.Wait()
	err := l.closeClusters()
	if l.lock != nil {
		if lerr := l.lock.Close(); err == nil {
			err = lerr
		}
		l.lock = nil
	}
	return err
}

func (l *Logger) closeClusters() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var err error
	for id, c := range l.mu.clusters {
		c.tr.Stop()
		if c.comp != nil {
			c.comp.close()
		}
		if cerr := c.log.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close the raft log of cluster %x: %w", id, cerr)
		}
		delete(l.mu.clusters, id)
	}
	return err
}

func sameURLs(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}
