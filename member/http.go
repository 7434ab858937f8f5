package member

// The client URLs' HTTP side: /health, /livez, /readyz, /version, /metrics,
// the JSON gateway and, with --enable-pprof, /debug/pprof/, served on the
// same ports as gRPC (server.SplitListener sends HTTP/2 connections to gRPC
// and HTTP/1.x ones here, as etcd's cmux does), and the member's metrics.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/raftlog"
	"github.com/strata-kv/strata/server"
	"github.com/strata-kv/strata/tlsconfig"
	"github.com/strata-kv/strata/transport"
)

// clientHTTP is the member's HTTP serving state.
//
// Concurrency: built in Start before any goroutine runs; servers, splits and
// gatewayConn are set by serveClients and read by stopClientHTTP, both on
// the goroutine that runs Start and Stop.
type clientHTTP struct {
	metrics     *server.Metrics
	servers     []*http.Server
	splits      []*server.SplitListener
	gatewayConn *grpc.ClientConn
	// metricsListeners are the --listen-metrics-urls, bound by
	// listenMetrics and served by serveClients.
	metricsListeners []net.Listener
}

// newClientHTTP builds the member's metrics. The source's functions read
// the member's components when /metrics is scraped, which happens only
// once serveClients has run, after Start built them all.
func (m *Member) newClientHTTP() *clientHTTP {
	return &clientHTTP{metrics: server.NewMetrics(server.MetricsSource{
		MemberID:        m.memberID,
		Leader:          func() uint64 { return m.node.Leader() },
		LeaderChanges:   func() uint64 { return m.node.LeaderChanges() },
		CommitIndex:     func() uint64 { return m.node.CommitIndex() },
		AppliedIndex:    func() uint64 { return m.applier.AppliedIndex() },
		DBSize:          func() int64 { return m.engine.DiskSize() },
		Revision:        func() int64 { return m.store.Rev() },
		CompactRevision: func() int64 { return m.store.CompactRev() },
		Log:             func() raftlog.Stats { return m.log.Stats() },
		LogFsyncs:       func() raftlog.Histogram { return m.log.FsyncHistogram() },
		LogIndexes: func() (uint64, uint64) {
			first, _ := m.log.FirstIndex()
			last, _ := m.log.LastIndex()
			return first, last
		},
		EngineApplied: func() uint64 { return m.engine.AppliedIndex() },
		EngineDurable: func() uint64 { return m.engine.DurableIndex() },
	})}
}

// timedEngine wraps the engine the MVCC store writes through so that every
// batch commit is timed (etcd_disk_backend_commit_duration_seconds). Only
// the store's writes go through it; reads pass straight to the engine.
func (w *clientHTTP) timedEngine(e engine.Engine) engine.Engine {
	return &timedEngine{Engine: e, metrics: w.metrics}
}

type timedEngine struct {
	engine.Engine
	metrics *server.Metrics
}

func (e *timedEngine) NewBatch() engine.Batch {
	return &timedBatch{Batch: e.Engine.NewBatch(), metrics: e.metrics}
}

type timedBatch struct {
	engine.Batch
	metrics *server.Metrics
}

func (b *timedBatch) Commit(appliedIndex uint64) error {
	start := time.Now()
	err := b.Batch.Commit(appliedIndex)
	b.metrics.ObserveBackendCommit(time.Since(start))
	return err
}

func (b *timedBatch) CommitWith(appliedIndex uint64, tails []engine.WriteOnlyBatch) error {
	start := time.Now()
	err := b.Batch.CommitWith(appliedIndex, tails)
	b.metrics.ObserveBackendCommit(time.Since(start))
	return err
}

// grpcServerOptions adds the metrics interceptors to the client gRPC
// server's options.
func (w *clientHTTP) grpcServerOptions(limits server.Limits) []grpc.ServerOption {
	return append(limits.ServerOptions(), w.metrics.GRPCServerOptions()...)
}

// serveClients serves gRPC and HTTP on every client listener. The JSON
// gateway talks to this member's gRPC server over a loopback connection to
// the first listener, as etcd's does; if that connection cannot be set up
// the gateway is off and the rest is served.
//
// On https client URLs the listener routes by the ClientHello's ALPN
// (server.NewTLSSplitListener): gRPC connections keep going to the gRPC
// server, which does its own handshake (its credentials carry the client
// certificate to auth); the HTTP side terminates TLS here with the same
// certificate and client-certificate rules, offering only HTTP/1.1.
//
// Clients are served only once the member is ready (awaitReady): the
// listeners are open from the start, so clients connect and wait, as
// etcd's do.
func (m *Member) serveClients(ctx context.Context, limits server.Limits) {
	w := m.web
	ready := m.awaitReady(ctx)
	// The peer round-trip metric is /metrics' too; its prober lives with ctx.
	if prober, err := transport.NewProber(transport.ProberConfig{
		LocalID: m.memberID, Members: m.applier, TLS: m.cfg.TLS.Peer,
		Registry: w.metrics.Registry(), Logger: m.logger.Named("probe"),
	}); err != nil {
		m.logger.Warn("peer round-trip times not measured", zap.Error(err))
	} else {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			prober.Run(ctx)
		}()
	}
	secure, _ := tlsconfig.URLsSecure("--listen-client-urls", m.cfg.ListenClientURLs)
	var httpTLS *tls.Config
	dialCreds := insecure.NewCredentials()
	if secure {
		cfg, err := m.cfg.TLS.Client.ServerConfig()
		if err != nil {
			// startSecurity built the gRPC credentials from the same
			// files a moment ago; failing now means they changed.
			m.logger.Warn("HTTP endpoints not served on https client URLs", zap.Error(err))
			for _, l := range m.listener {
				go func() {
					if !waitReady(ctx, ready) {
						_ = l.Close() // never served: nothing else closes it
						return
					}
					_ = m.grpc.Serve(l)
				}()
			}
			return
		}
		httpTLS = cfg.Clone()
		httpTLS.NextProtos = []string{"http/1.1"}
		if dialTLS, err := m.cfg.TLS.Client.ClientConfig(); err == nil {
			// The loopback dial reaches this process's own listening
			// socket, whose certificate may not name the loopback
			// address; etcd skips verification here for the same reason.
			dialTLS.InsecureSkipVerify = true
			dialCreds = credentials.NewTLS(dialTLS)
		}
	}
	var gateway http.Handler
	if len(m.listener) > 0 {
		conn, err := grpc.NewClient("passthrough:///"+loopbackAddr(m.listener[0].Addr()),
			grpc.WithTransportCredentials(dialCreds),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)))
		if err == nil {
			gateway, err = server.NewGateway(ctx, conn)
			w.gatewayConn = conn
		}
		if err != nil {
			m.logger.Warn("JSON gateway not served", zap.Error(err))
		}
	}
	handler := server.NewHTTPHandler(server.HTTPConfig{
		Backend:        m,
		Range:          server.NewKV(m, limits).Range,
		RequestTimeout: limits.RequestTimeout,
		Metrics:        w.metrics.Handler(),
		Stats:          w.metrics,
		Gateway:        gateway,
		Pprof:          m.cfg.EnablePprof,
		Logger:         m.logger.Named("http"),
	})
	if len(w.metricsListeners) > 0 {
		// etcd serves /metrics and the health endpoints there, no gateway.
		metricsHandler := server.NewHTTPHandler(server.HTTPConfig{
			Backend:        m,
			Range:          server.NewKV(m, limits).Range,
			RequestTimeout: limits.RequestTimeout,
			Metrics:        w.metrics.Handler(),
			Stats:          w.metrics,
			Logger:         m.logger.Named("http"),
		})
		for _, l := range w.metricsListeners {
			srv := &http.Server{Handler: metricsHandler, ReadHeaderTimeout: 10 * time.Second}
			w.servers = append(w.servers, srv)
			go func() {
				if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
					m.logger.Warn("metrics server stopped", zap.Error(err))
				}
			}()
		}
	}
	for _, l := range m.listener {
		var split *server.SplitListener
		var httpL net.Listener
		if secure {
			split = server.NewTLSSplitListener(l, m.logger.Named("listener"))
			httpL = tls.NewListener(split.HTTP(), httpTLS)
		} else {
			split = server.NewSplitListener(l, m.logger.Named("listener"))
			httpL = split.HTTP()
		}
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		w.splits = append(w.splits, split)
		w.servers = append(w.servers, srv)
		go func() {
			if !waitReady(ctx, ready) {
				return
			}
			go func() { _ = m.grpc.Serve(split.GRPC()) }()
			go func() {
				if err := srv.Serve(httpL); err != nil && !errors.Is(err, http.ErrServerClosed) {
					m.logger.Warn("HTTP server stopped", zap.Error(err))
				}
			}()
			if err := split.Serve(); err != nil {
				m.logger.Warn("client listener stopped", zap.Error(err))
			}
		}()
	}
}

// awaitReady returns a channel closed once the member may serve clients:
// it has a leader and has applied everything the cluster had committed
// when it asked (a ReadIndex barrier, retried until it succeeds or ctx
// ends). Until then its engine may hold an older state than it had
// acknowledged before a crash -- the entries after the engine's last
// flush are replayed through raft after start-up -- and answering from it
// would send Status and serializable reads back in time (issue 10 finding
// 10). etcd likewise serves clients only once it has published itself
// through raft, which it applies after every entry before it.
func (m *Member) awaitReady(ctx context.Context) <-chan struct{} {
	ready := make(chan struct{})
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for ctx.Err() == nil {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := m.ReadBarrier(rctx)
			cancel()
			if err == nil {
				m.logger.Info("ready to serve client requests",
					zap.Uint64("applied-index", m.applier.AppliedIndex()), zap.Int64("revision", m.store.Rev()))
				close(ready)
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return ready
}

// waitReady waits until ready is closed or ctx ends, and reports which.
func waitReady(ctx context.Context, ready <-chan struct{}) bool {
	select {
	case <-ready:
		return true
	case <-ctx.Done():
		return false
	}
}

// listenMetrics binds the --listen-metrics-urls. On a later failure of
// Start they stay open until the process exits, as Start's failures end it.
func (m *Member) listenMetrics() error {
	for _, u := range m.cfg.ListenMetricsURLs {
		addr, err := transport.HostPort(u)
		if err != nil {
			return fmt.Errorf("--listen-metrics-urls: %w", err)
		}
		if !strings.HasPrefix(u, "http://") {
			return fmt.Errorf("--listen-metrics-urls: %s: only http is supported", u)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen on metrics URL %s: %w", u, err)
		}
		m.web.metricsListeners = append(m.web.metricsListeners, l)
	}
	return nil
}

// stopClientHTTP ends the HTTP side and the gateway's loopback connection
// (whose streams would otherwise hold up the gRPC server's graceful stop),
// and closes the client listeners.
func (m *Member) stopClientHTTP() {
	w := m.web
	if w == nil {
		return
	}
	for _, srv := range w.servers {
		_ = srv.Close()
	}
	if w.gatewayConn != nil {
		_ = w.gatewayConn.Close()
	}
	for _, s := range w.splits {
		_ = s.Close()
	}
}

// loopbackAddr turns a listener's address into one this process can dial:
// a wildcard host (0.0.0.0, ::) becomes the loopback address.
func loopbackAddr(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return a.String()
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port))
}
