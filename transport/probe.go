package transport

// Peer round-trip times for etcd_network_peer_round_trip_time_seconds.
// etcd's rafthttp probes each peer's /raft/probing every few seconds; strata
// calls the peer server's Cluster.MemberList (serializable: no raft work, a
// small answer) on a connection of its own, so that a slow raft stream does
// not skew the measure and the transport needs no change.

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/strata-kv/strata/tlsconfig"
)

// peerProbeInterval is how often each peer is probed: etcd's prober
// interval (its connection read timeout, 5 s, minus a second).
const peerProbeInterval = 4 * time.Second

// peerProbeTimeout bounds one probe; a peer that does not answer in time
// records no sample, as in etcd.
const peerProbeTimeout = 2 * time.Second

// ProberConfig is a prober's collaborators.
type ProberConfig struct {
	// LocalID is this member's ID: it probes every other member.
	LocalID uint64
	// Members lists the cluster's members (the applier's).
	Members interface{ Members() []*pb.Member }
	// TLS dials the peers' URLs.
	TLS tlsconfig.Info
	// Registry receives the round-trip histogram.
	Registry *prometheus.Registry
	Logger   *zap.Logger
}

// Prober times a probe of each peer every peerProbeInterval, for
// etcd_network_peer_round_trip_time_seconds. It keeps one connection per
// peer.
//
// Concurrency: Run is its only goroutine.
type Prober struct {
	cfg   ProberConfig
	rtt   *prometheus.HistogramVec
	conns map[uint64]probeConn
}

type probeConn struct {
	url  string
	conn *grpc.ClientConn
}

// NewProber registers the round-trip histogram; Run probes.
func NewProber(cfg ProberConfig) (*Prober, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	rtt := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "etcd_network_peer_round_trip_time_seconds",
		Help:    "Round-Trip-Time histogram between peers (strata: a serializable MemberList on the peer URL).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	}, []string{"To"})
	if err := cfg.Registry.Register(rtt); err != nil {
		return nil, fmt.Errorf("register the peer round-trip histogram: %w", err)
	}
	return &Prober{cfg: cfg, rtt: rtt, conns: map[uint64]probeConn{}}, nil
}

// Run probes the peers until ctx ends, then closes its connections.
func (p *Prober) Run(ctx context.Context) {
	defer p.closeAll()
	t := time.NewTicker(peerProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.probeAll(ctx)
		}
	}
}

func (p *Prober) probeAll(ctx context.Context) {
	seen := map[uint64]bool{}
	for _, mem := range p.cfg.Members.Members() {
		if mem.ID == p.cfg.LocalID || len(mem.PeerURLs) == 0 {
			continue
		}
		seen[mem.ID] = true
		c, err := p.conn(mem.ID, mem.PeerURLs[0])
		if err != nil {
			p.cfg.Logger.Debug("cannot dial peer to probe it", zap.String("peer", strconv.FormatUint(mem.ID, 16)), zap.Error(err))
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, peerProbeTimeout)
		start := time.Now()
		_, err = pb.NewClusterClient(c).MemberList(pctx, &pb.MemberListRequest{})
		took := time.Since(start)
		cancel()
		if err == nil {
			p.rtt.WithLabelValues(strconv.FormatUint(mem.ID, 16)).Observe(took.Seconds())
		}
	}
	for id, c := range p.conns {
		if !seen[id] {
			_ = c.conn.Close()
			delete(p.conns, id)
			p.rtt.DeleteLabelValues(strconv.FormatUint(id, 16))
		}
	}
}

// conn returns the connection to a peer, redialled when its URL changed.
func (p *Prober) conn(id uint64, rawURL string) (*grpc.ClientConn, error) {
	if c, ok := p.conns[id]; ok {
		if c.url == rawURL {
			return c.conn, nil
		}
		_ = c.conn.Close()
		delete(p.conns, id)
	}
	addr, err := HostPort(rawURL)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(p.cfg.TLS.DialCreds(rawURL, p.cfg.Logger)))
	if err != nil {
		return nil, err
	}
	p.conns[id] = probeConn{url: rawURL, conn: conn}
	return conn, nil
}

func (p *Prober) closeAll() {
	for _, c := range p.conns {
		_ = c.conn.Close()
	}
}

// HostPort is the host:port of a member's URL (a peer or client URL:
// http or https).
func HostPort(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("invalid URL %q: want scheme://host:port", rawURL)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("URL %q: want http or https", rawURL)
	}
	return u.Host, nil
}

// Listen listens on the host:port of every URL, in order, with
// ListenConfig's defaults; see ListenConfig.Listen.
func Listen(what string, urls []string) ([]net.Listener, error) {
	return ListenConfig{}.Listen(what, urls)
}

// ListenConfig is etcd's socket options for the listeners of the client,
// peer and metrics URLs (--socket-reuse-port, --socket-reuse-address).
type ListenConfig struct {
	// ReusePort sets SO_REUSEPORT: another process may bind the same port
	// (unix only).
	ReusePort bool
	// ReuseAddress sets SO_REUSEADDR, which Go already sets on every
	// listener on unix.
	ReuseAddress bool
}

// ListenAddr listens on addr (host:port) with c's socket options.
func (c ListenConfig) ListenAddr(addr string) (net.Listener, error) {
	if !c.ReusePort && !c.ReuseAddress {
		return net.Listen("tcp", addr)
	}
	lc := net.ListenConfig{Control: c.control}
	return lc.Listen(context.Background(), "tcp", addr)
}

// Listen listens on the host:port of every URL, in order; what names the
// URLs in errors ("client", "peer"). On error it closes what it opened.
func (c ListenConfig) Listen(what string, urls []string) ([]net.Listener, error) {
	var out []net.Listener
	for _, u := range urls {
		addr, err := HostPort(u)
		if err == nil {
			var l net.Listener
			if l, err = c.ListenAddr(addr); err == nil {
				out = append(out, l)
				continue
			}
		}
		for _, l := range out {
			l.Close()
		}
		return nil, fmt.Errorf("listen on %s URL %s: %w", what, u, err)
	}
	return out, nil
}
