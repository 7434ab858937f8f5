package member

// Peer round-trip times for etcd_network_peer_round_trip_time_seconds.
// etcd's rafthttp probes each peer's /raft/probing every few seconds; strata
// calls the peer server's Cluster.MemberList (serializable: no raft work, a
// small answer) on a connection of its own, so that a slow raft stream does
// not skew the measure and the transport needs no change.

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// peerProbeInterval is how often each peer is probed: etcd's prober
// interval (its connection read timeout, 5 s, minus a second).
const peerProbeInterval = 4 * time.Second

// peerProbeTimeout bounds one probe; a peer that does not answer in time
// records no sample, as in etcd.
const peerProbeTimeout = 2 * time.Second

// peerProber keeps one connection per peer and times a probe on each.
//
// Concurrency: used only by the goroutine that runs probePeers.
type peerProber struct {
	m     *Member
	rtt   *prometheus.HistogramVec
	conns map[uint64]probeConn
}

type probeConn struct {
	url  string
	conn *grpc.ClientConn
}

// startPeerProber registers the round-trip histogram and starts the probing
// goroutine, which ends with ctx (Stop cancels it and waits on m.wg).
func (m *Member) startPeerProber(ctx context.Context) {
	rtt := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "etcd_network_peer_round_trip_time_seconds",
		Help:    "Round-Trip-Time histogram between peers (strata: a serializable MemberList on the peer URL).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	}, []string{"To"})
	if err := m.web.metrics.Registry().Register(rtt); err != nil {
		m.logger.Warn("peer round-trip metric not registered", zap.Error(err))
		return
	}
	p := &peerProber{m: m, rtt: rtt, conns: map[uint64]probeConn{}}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
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
	}()
}

func (p *peerProber) probeAll(ctx context.Context) {
	seen := map[uint64]bool{}
	for _, mem := range p.m.applier.Members() {
		if mem.ID == p.m.memberID || len(mem.PeerURLs) == 0 {
			continue
		}
		seen[mem.ID] = true
		c, err := p.conn(mem.ID, mem.PeerURLs[0])
		if err != nil {
			p.m.logger.Debug("cannot dial peer to probe it", zap.String("peer", strconv.FormatUint(mem.ID, 16)), zap.Error(err))
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
func (p *peerProber) conn(id uint64, rawURL string) (*grpc.ClientConn, error) {
	if c, ok := p.conns[id]; ok {
		if c.url == rawURL {
			return c.conn, nil
		}
		_ = c.conn.Close()
		delete(p.conns, id)
	}
	addr, err := hostPort(rawURL)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(p.m.cfg.TLS.Peer.DialCreds(rawURL, p.m.logger)))
	if err != nil {
		return nil, err
	}
	p.conns[id] = probeConn{url: rawURL, conn: conn}
	return conn, nil
}

func (p *peerProber) closeAll() {
	for _, c := range p.conns {
		_ = c.conn.Close()
	}
}
