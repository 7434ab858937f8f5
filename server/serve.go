package server

// Serving the client URLs: gRPC and, on the same ports, HTTP (/health,
// /livez, /readyz, /version, /metrics, the JSON gateway and, with
// --enable-pprof, /debug/pprof/). transport.SplitListener sends HTTP/2 connections
// to gRPC and HTTP/1.x ones to the HTTP server, as etcd's cmux does.

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
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/strata-kv/strata/tlsconfig"
	"github.com/strata-kv/strata/transport"
)

// ClientConfig is what a ClientServer serves.
type ClientConfig struct {
	// Listeners are the bound --listen-client-urls; Secure says they are
	// https, served with TLS's client certificates and rules.
	Listeners []net.Listener
	Secure    bool
	TLS       tlsconfig.Info
	// MetricsListeners are the bound --listen-metrics-urls: /metrics and
	// the health endpoints, no gateway, as etcd serves there.
	MetricsListeners []net.Listener
	// GRPC is the client gRPC server, with every service registered.
	GRPC    *grpc.Server
	Backend Backend
	Limits  Limits
	Metrics *Metrics
	// Pprof serves /debug/pprof/ (--enable-pprof).
	Pprof bool
	// NoGateway leaves etcd's JSON gateway (/v3/) unserved
	// (--enable-grpc-gateway=false).
	NoGateway bool
	// Access is --cors and --host-whitelist on the client URLs' HTTP side.
	Access AccessControl
	// HTTPListeners are the bound --listen-client-http-urls, of the same
	// scheme as the client URLs. When there are any, HTTP is served there
	// alone and the client listeners serve gRPC alone, as etcd does.
	HTTPListeners []net.Listener
	// Published, if set, is closed once the member has published itself
	// to the cluster (membership.Service.Published): as etcd's, a member
	// serves clients only after that.
	Published <-chan struct{}
	Logger    *zap.Logger
}

// ClientServer serves the client URLs.
//
// Concurrency: Serve, Stop and Wait are called once each, in that order,
// from the goroutine that starts and stops the member.
type ClientServer struct {
	cfg         ClientConfig
	servers     []*http.Server
	splits      []*transport.SplitListener
	gatewayConn *grpc.ClientConn
	wg          sync.WaitGroup // the readiness wait
}

// NewClientServer returns a server for cfg; Serve starts it.
func NewClientServer(cfg ClientConfig) *ClientServer {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &ClientServer{cfg: cfg}
}

// ListenMetrics binds the --listen-metrics-urls. As in etcd, an https URL
// is served with the client URLs' TLS (clientTLS: certificate, client
// certificate rules); the listeners it returns for those hand out TLS
// connections; sockets are the listeners' socket options. On error it
// closes what it opened.
func ListenMetrics(urls []string, clientTLS tlsconfig.Info, sockets transport.ListenConfig) ([]net.Listener, error) {
	var out []net.Listener
	fail := func(err error) ([]net.Listener, error) {
		for _, l := range out {
			l.Close()
		}
		return nil, err
	}
	for _, u := range urls {
		addr, err := transport.HostPort(u)
		if err != nil {
			return fail(fmt.Errorf("--listen-metrics-urls: %w", err))
		}
		var cfg *tls.Config
		if strings.HasPrefix(u, "https://") {
			if cfg, err = clientTLS.ServerConfig(); err != nil {
				return fail(fmt.Errorf("--listen-metrics-urls: %s: %w", u, err))
			}
		}
		l, err := sockets.ListenAddr(addr)
		if err != nil {
			return fail(fmt.Errorf("listen on metrics URL %s: %w", u, err))
		}
		if cfg != nil {
			l = tls.NewListener(l, cfg)
		}
		out = append(out, l)
	}
	return out, nil
}

// Serve serves gRPC and HTTP on every client listener once the member is
// ready, and the metrics listeners at once. The JSON gateway talks to the
// gRPC server over a loopback connection to the first listener, as etcd's
// does; if that connection cannot be set up the gateway is off and the
// rest is served.
//
// On https client URLs the listener routes by the ClientHello's ALPN
// (NewTLSSplitListener): gRPC connections keep going to the gRPC server,
// which does its own handshake (its credentials carry the client
// certificate to auth); the HTTP side terminates TLS here with the same
// certificate and client-certificate rules, offering only HTTP/1.1.
//
// Clients are served only once the member is ready (awaitReady): the
// listeners are open from the start, so clients connect and wait, as
// etcd's do. Serve returns at once; ctx ends the wait.
func (s *ClientServer) Serve(ctx context.Context) {
	cfg, log := s.cfg, s.cfg.Logger
	ready := s.awaitReady(ctx)
	var httpTLS *tls.Config
	dialCreds := insecure.NewCredentials()
	if cfg.Secure {
		serverTLS, err := cfg.TLS.ServerConfig()
		if err != nil {
			// The gRPC credentials were built from the same files a
			// moment ago; failing now means they changed.
			log.Warn("HTTP endpoints not served on https client URLs", zap.Error(err))
			for _, l := range cfg.Listeners {
				go func() {
					if !waitReady(ctx, ready) {
						_ = l.Close() // never served: nothing else closes it
						return
					}
					_ = cfg.GRPC.Serve(l)
				}()
			}
			return
		}
		httpTLS = serverTLS.Clone()
		httpTLS.NextProtos = []string{"http/1.1"}
		if dialTLS, err := cfg.TLS.ClientConfig(); err == nil {
			// The loopback dial reaches this process's own listening
			// socket, whose certificate may not name the loopback
			// address; etcd skips verification here for the same reason.
			dialTLS.InsecureSkipVerify = true
			dialTLS.VerifyPeerCertificate = nil // nothing verified: no allowed names to check
			dialCreds = credentials.NewTLS(dialTLS)
		}
	}
	var gateway http.Handler
	if len(cfg.Listeners) > 0 && !cfg.NoGateway {
		conn, err := grpc.NewClient("passthrough:///"+loopbackAddr(cfg.Listeners[0].Addr()),
			grpc.WithTransportCredentials(dialCreds),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)))
		if err == nil {
			gateway, err = NewGateway(ctx, conn)
			s.gatewayConn = conn
		}
		if err != nil {
			log.Warn("JSON gateway not served", zap.Error(err))
		}
	}
	httpConfig := func(gateway http.Handler, pprof bool) HTTPConfig {
		return HTTPConfig{
			Backend:        cfg.Backend,
			Range:          NewKV(cfg.Backend, cfg.Limits).Range,
			RequestTimeout: cfg.Limits.RequestTimeout,
			Metrics:        cfg.Metrics.Handler(),
			Stats:          cfg.Metrics,
			Gateway:        gateway,
			Pprof:          pprof,
			Logger:         log.Named("http"),
		}
	}
	if len(cfg.MetricsListeners) > 0 {
		metricsHandler := NewHTTPHandler(httpConfig(nil, false))
		for _, l := range cfg.MetricsListeners {
			srv := &http.Server{Handler: metricsHandler, ReadHeaderTimeout: 10 * time.Second}
			s.servers = append(s.servers, srv)
			go func() {
				if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
					log.Warn("metrics server stopped", zap.Error(err))
				}
			}()
		}
	}
	handler := cfg.Access.Wrap(NewHTTPHandler(httpConfig(gateway, cfg.Pprof)), log.Named("http"))
	if len(cfg.HTTPListeners) > 0 {
		s.serveApart(ctx, ready, handler, httpTLS)
		return
	}
	for _, l := range cfg.Listeners {
		var split *transport.SplitListener
		var httpL net.Listener
		if cfg.Secure {
			split = transport.NewTLSSplitListener(l, log.Named("listener"))
			httpL = tls.NewListener(split.HTTP(), httpTLS)
		} else {
			split = transport.NewSplitListener(l, log.Named("listener"))
			httpL = split.HTTP()
		}
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		s.splits = append(s.splits, split)
		s.servers = append(s.servers, srv)
		go func() {
			if !waitReady(ctx, ready) {
				return
			}
			go func() { _ = cfg.GRPC.Serve(split.GRPC()) }()
			go func() {
				if err := srv.Serve(httpL); err != nil && !errors.Is(err, http.ErrServerClosed) {
					log.Warn("HTTP server stopped", zap.Error(err))
				}
			}()
			if err := split.Serve(); err != nil {
				log.Warn("client listener stopped", zap.Error(err))
			}
		}()
	}
}

// serveApart is Serve with --listen-client-http-urls: gRPC alone on the
// client listeners, HTTP (with httpTLS on https URLs) alone on the HTTP
// listeners, both once the member is ready.
func (s *ClientServer) serveApart(ctx context.Context, ready <-chan struct{}, handler http.Handler, httpTLS *tls.Config) {
	cfg, log := s.cfg, s.cfg.Logger
	for _, l := range cfg.Listeners {
		go func() {
			if !waitReady(ctx, ready) {
				_ = l.Close() // never served: nothing else closes it
				return
			}
			_ = cfg.GRPC.Serve(l)
		}()
	}
	for _, l := range cfg.HTTPListeners {
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		s.servers = append(s.servers, srv)
		httpL := l
		if httpTLS != nil {
			httpL = tls.NewListener(l, httpTLS)
		}
		go func() {
			if !waitReady(ctx, ready) {
				_ = l.Close()
				return
			}
			if err := srv.Serve(httpL); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Warn("HTTP server stopped", zap.Error(err))
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
func (s *ClientServer) awaitReady(ctx context.Context) <-chan struct{} {
	ready := make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for ctx.Err() == nil {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := s.cfg.Backend.ReadBarrier(rctx)
			cancel()
			if err == nil && s.cfg.Published != nil {
				select {
				case <-s.cfg.Published:
				case <-ctx.Done():
					return
				}
			}
			if err == nil {
				s.cfg.Logger.Info("ready to serve client requests",
					zap.Uint64("applied-index", s.cfg.Backend.Status().AppliedIndex), zap.Int64("revision", s.cfg.Backend.Store().Rev()))
				s.logServing()
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

// logServing logs, per client listener, etcd's line saying what it
// serves and whether over TLS.
func (s *ClientServer) logServing() {
	traffic := "grpc+http"
	if len(s.cfg.HTTPListeners) > 0 {
		traffic = "grpc"
	}
	msg := "serving client traffic insecurely; this is strongly discouraged!"
	if s.cfg.Secure {
		msg = "serving client traffic securely"
	}
	for _, l := range s.cfg.Listeners {
		s.cfg.Logger.Info(msg, zap.String("traffic", traffic), zap.String("address", l.Addr().String()))
	}
}

// Stop ends the HTTP side and the gateway's loopback connection (whose
// streams would otherwise hold up the gRPC server's graceful stop), and
// closes the client listeners. The caller stops the gRPC server.
func (s *ClientServer) Stop() {
	for _, srv := range s.servers {
		_ = srv.Close()
	}
	if s.gatewayConn != nil {
		_ = s.gatewayConn.Close()
	}
	for _, sl := range s.splits {
		_ = sl.Close()
	}
}

// Wait returns once the readiness wait has ended, which it does when
// Serve's ctx ends.
func (s *ClientServer) Wait() { s.wg.Wait() }

// loopbackAddr turns a listener's address into one this process can dial:
// a wildcard host (0.0.0.0, ::) becomes the loopback address.
func loopbackAddr(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return a.String()
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(tcp.Port))
}
