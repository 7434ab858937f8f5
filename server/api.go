package server

// The client API as one component: NewAPI builds the gRPC server with every
// etcd service registered over the member's parts, binds the client,
// metrics and client-HTTP listeners, and hands them to a ClientServer. The
// member passes its parts in and starts and stops the API; what the API
// serves and how is decided here.

import (
	"context"
	"net"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/node"
	"github.com/strata-kv/strata/server/concurrency"
	"github.com/strata-kv/strata/tlsconfig"
	"github.com/strata-kv/strata/transport"
	"github.com/strata-kv/strata/watch"
)

// ClientOptions are etcd's flags for the client side that only the API
// reads.
type ClientOptions struct {
	// ListenMetricsURLs serve /metrics and the health endpoints
	// (--listen-metrics-urls; https ones with the client TLS).
	ListenMetricsURLs []string
	// ListenHTTPURLs serve HTTP alone, the client URLs then gRPC alone
	// (--listen-client-http-urls).
	ListenHTTPURLs []string
	// Pprof serves Go's runtime profiles under /debug/pprof/
	// (--enable-pprof).
	Pprof bool
	// NoGateway is --enable-grpc-gateway=false.
	NoGateway bool
	// Access is --cors and --host-whitelist.
	Access AccessControl
	// Limits are --max-request-bytes, --max-txn-ops,
	// --max-concurrent-streams and --grpc-keepalive-*. A zero
	// RequestTimeout is set by NewAPI from the election timeout.
	Limits Limits
	// WarnUnaryDuration is --warning-unary-request-duration (0: etcd's
	// 300ms).
	WarnUnaryDuration time.Duration
}

// RequestTimeout is how long a request waits for raft: etcd's 5 s plus two
// election timeouts, long enough to ride out one election.
func RequestTimeout(electionTimeout time.Duration) time.Duration {
	return 5*time.Second + 2*electionTimeout
}

// ClusterAdmin changes the member list (the Cluster service), moves the
// leader (Maintenance) and says when the member has published itself, after
// which clients are served (membership.Service).
type ClusterAdmin interface {
	Membership
	LeaderMover
	Published() <-chan struct{}
}

// Registrar registers a further gRPC service on the client URLs.
type Registrar interface {
	Register(*grpc.Server)
}

// APIConfig is what NewAPI builds the client API from.
type APIConfig struct {
	Options ClientOptions
	// ListenURLs are the --listen-client-urls, bound with Sockets' options
	// and served with TLS.
	ListenURLs []string
	Sockets    transport.ListenConfig
	TLS        tlsconfig.Info
	// PeerTLS dials the leader's peer URL, where lease requests are
	// forwarded (the --peer-* files).
	PeerTLS tlsconfig.Info
	// ElectionTimeout sets Limits.RequestTimeout when it is zero.
	ElectionTimeout time.Duration
	// QuotaBackendBytes is what Maintenance.Status reports as the quota.
	QuotaBackendBytes int64

	Backend    Backend
	Auth       *auth.Store
	Lessor     *lease.Lessor
	Watches    *watch.Hub
	Maintainer MaintenanceBackend
	Admin      ClusterAdmin
	// Services are registered beside etcd's (the backup service).
	Services []Registrar
	// Incoming counts the KV write requests on their way to the member's
	// raft node (node.Incoming), which the node's group commit waits for;
	// nil counts nothing.
	Incoming *node.Incoming
	Metrics  *Metrics
	Logger   *zap.Logger
}

// API is the member's client API: etcd's gRPC services and the HTTP side
// on the client URLs, and the metrics URLs.
//
// Concurrency: NewAPI, Serve, Stop and Wait are called once each, in that
// order, from the goroutine that starts and stops the member; Close instead
// of Serve when the member fails to start.
type API struct {
	grpc    *grpc.Server
	leases  *Lease
	cluster *Cluster
	clients *ClientServer
	// listeners are every listener NewAPI bound, closed by Close.
	listeners []net.Listener
	// Listeners are the bound --listen-client-urls, in their order.
	Listeners []net.Listener
}

// NewAPI registers every service and binds the listeners; Serve serves
// them. On error it closes what it bound.
func NewAPI(cfg APIConfig) (_ *API, err error) {
	limits := cfg.Options.Limits
	if limits.RequestTimeout == 0 {
		limits.RequestTimeout = RequestTimeout(cfg.ElectionTimeout)
	}
	security, err := tlsconfig.ServerCreds("--listen-client-urls", cfg.ListenURLs, cfg.TLS)
	if err != nil {
		return nil, err
	}
	b := cfg.Backend
	var leases LeaseLister
	if cfg.Lessor != nil {
		leases = cfg.Lessor
	}
	authService := NewAuth(b, cfg.Auth, limits, cfg.TLS.ClientCertAuth, leases)
	a := &API{
		grpc: grpc.NewServer(slices.Concat([]grpc.ServerOption{grpc.InTapHandle(countWrites(cfg.Incoming)),
			RequestStatsOptions(cfg.Options.WarnUnaryDuration, cfg.Logger)},
			limits.ServerOptions(), cfg.Metrics.GRPCServerOptions(), security, authService.ServerOptions())...),
		leases:  NewLease(b, cfg.Lessor, limits, cfg.PeerTLS, cfg.Logger),
		cluster: NewCluster(b, cfg.Admin),
	}
	pb.RegisterAuthServer(a.grpc, authService)
	registerKV(a.grpc, NewKV(b, limits))
	pb.RegisterLeaseServer(a.grpc, a.leases)
	pb.RegisterWatchServer(a.grpc, NewWatch(b, cfg.Watches, limits))
	// etcd's v3lock and v3election services, over the member's own KV and
	// Lease services and watch hub, called in-process: a request's context
	// (deadline, caller) reaches them as it came.
	concurrency.Register(a.grpc, concurrency.Backend{
		KV: NewKV(b, limits), Leases: a.leases, Watches: cfg.Watches, Authorizer: authService,
		Logger: cfg.Logger.Named("concurrency"),
	})
	pb.RegisterMaintenanceServer(a.grpc, NewMaintenance(b, cfg.Maintainer, cfg.Admin, cfg.QuotaBackendBytes, limits.RequestTimeout))
	pb.RegisterClusterServer(a.grpc, a.cluster)
	for _, s := range cfg.Services {
		s.Register(a.grpc)
	}
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(a.grpc, hs)

	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if a.Listeners, err = cfg.Sockets.Listen("client", cfg.ListenURLs); err != nil {
		return nil, err
	}
	a.listeners = append(a.listeners, a.Listeners...)
	metricsListeners, err := ListenMetrics(cfg.Options.ListenMetricsURLs, cfg.TLS, cfg.Sockets)
	if err != nil {
		return nil, err
	}
	a.listeners = append(a.listeners, metricsListeners...)
	httpListeners, err := cfg.Sockets.Listen("client HTTP", cfg.Options.ListenHTTPURLs)
	if err != nil {
		return nil, err
	}
	a.listeners = append(a.listeners, httpListeners...)
	secure, _ := tlsconfig.URLsSecure("--listen-client-urls", cfg.ListenURLs)
	a.clients = NewClientServer(ClientConfig{
		Listeners: a.Listeners, Secure: secure, TLS: cfg.TLS, MetricsListeners: metricsListeners,
		GRPC: a.grpc, Backend: b, Limits: limits, Metrics: cfg.Metrics, Pprof: cfg.Options.Pprof,
		NoGateway: cfg.Options.NoGateway, HTTPListeners: httpListeners, Published: cfg.Admin.Published(),
		Access: cfg.Options.Access, Logger: cfg.Logger,
	})
	return a, nil
}

// Serve starts serving (ClientServer.Serve) and returns.
func (a *API) Serve(ctx context.Context) { a.clients.Serve(ctx) }

// Stop stops serving: the HTTP side at once, gRPC gracefully for up to two
// seconds and then at once, and the lease keep-alive forwarding.
func (a *API) Stop() {
	a.clients.Stop()
	stopped := make(chan struct{})
	go func() {
		a.grpc.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		a.grpc.Stop()
	}
	_ = a.leases.Close()
}

// Wait returns once Serve's readiness wait has ended (ClientServer.Wait).
func (a *API) Wait() { a.clients.Wait() }

// Close closes the listeners of an API that will not be served.
func (a *API) Close() {
	for _, l := range a.listeners {
		l.Close()
	}
}

// RegisterPeer serves two things on the peer URLs as well
// (transport.PeerService): the Cluster service's MemberList, for members
// that join to learn the cluster, and the leader's KeepAlive and
// TimeToLive, which followers forward there (peerLease), as etcd's peer
// URLs serve both. Nothing else: the peer URLs have no auth, and
// membership changes go through the client API, where auth decides (a
// member forwards a promotion to the leader's client URL), as in etcd,
// whose peer URLs list members but change none.
func (a *API) RegisterPeer(s *grpc.Server) {
	pb.RegisterClusterServer(s, peerCluster{list: a.cluster})
	pb.RegisterLeaseServer(s, peerLease{l: a.leases})
}

// peerCluster is the Cluster service as the peer URLs serve it: MemberList,
// and Unimplemented for the rest.
type peerCluster struct {
	pb.UnimplementedClusterServer
	list *Cluster
}

// MemberList lists the members, as the client API does.
func (p peerCluster) MemberList(ctx context.Context, r *pb.MemberListRequest) (*pb.MemberListResponse, error) {
	return p.list.MemberList(ctx, r)
}
