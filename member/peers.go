package member

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"

	"github.com/strata-kv/strata/snapshot"
	"github.com/strata-kv/strata/transport"
)

// errRemoved stops a member that the cluster removed.
var errRemoved = errors.New("the member has been permanently removed from the cluster")

// Send implements node.Transport: the node is created before the transport
// (the transport delivers to the node), so the member stands between them.
func (m *Member) Send(msgs []*raftpb.Message) {
	if m.transport != nil {
		m.transport.Send(msgs)
	}
}

// newTransport builds the peer transport, which delivers to the node and
// the snapshotter.
func (m *Member) newTransport(snaps *snapshot.Snapshotter) error {
	_, peerTLS, err := m.cfg.TLS.PeerServing(m.cfg.ListenPeerURLs, m.cfg.AdvertisePeerURLs)
	if err != nil {
		return err
	}
	m.transport = transport.New(transport.Config{
		TLS:         peerTLS,
		LocalID:     m.memberID,
		ClusterID:   m.clusterID,
		Handler:     snaps.Reports(m.node),
		Snapshotter: snaps,
		Logger:      m.logger.Named("transport"),
	})
	return nil
}

// startPeerServer serves the peer transport and a read-only Cluster
// service (for members that join to learn the cluster) on the peer URLs.
func (m *Member) startPeerServer(cluster pb.ClusterServer) error {
	peerCreds, _, err := m.cfg.TLS.PeerServing(m.cfg.ListenPeerURLs, m.cfg.AdvertisePeerURLs)
	if err != nil {
		return err
	}
	m.peerGRPC = grpc.NewServer(append(peerCreds, grpc.MaxRecvMsgSize(1<<30), grpc.MaxSendMsgSize(1<<30))...)
	m.transport.Register(m.peerGRPC)
	pb.RegisterClusterServer(m.peerGRPC, cluster)
	for _, u := range m.cfg.ListenPeerURLs {
		addr, err := transport.HostPort(u)
		if err != nil {
			return err
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen on peer URL %s: %w", u, err)
		}
		m.peerListeners = append(m.peerListeners, l)
	}
	members := m.applier.Members()
	if len(members) == 0 {
		members = m.discovered
	}
	m.membersChanged(members)
	return nil
}

// membersChanged keeps the transport's peers equal to the cluster's other
// members, and stops this member once it is no longer one of them. It runs
// on the outcome loop (dispatchOutcomes), and once at start-up.
func (m *Member) membersChanged(members []*pb.Member) {
	if m.transport == nil {
		return
	}
	m.transport.SetPeers(members)
	self := slices.ContainsFunc(members, func(mem *pb.Member) bool { return mem.ID == m.memberID })
	if !self && len(members) > 0 && m.wasMember.Load() {
		// Stopping waits for the outcome loop, which runs this: stop from
		// elsewhere, and a moment later, so that the answer to the
		// removal (when this member was asked) reaches the client, as
		// etcd delays its stop.
		go m.stopRemoved()
	}
	if self {
		m.wasMember.Store(true)
	}
}

// watchRemoval stops a member that the cluster removed while it could not
// learn so through raft (the leader stops replicating to a member once its
// removal commits, so the member may never see that commit). A member with
// no leader for three election timeouts asks its peers for the member list;
// if a peer of its cluster answers without it, it stops, as etcd does.
func (m *Member) watchRemoval(ctx context.Context) {
	interval := 3 * m.cfg.ElectionTimeout
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
		if m.node.Leader() != 0 || !m.wasMember.Load() {
			continue
		}
		if m.remote.Removed() {
			m.stopRemoved()
			return
		}
	}
}

// stopRemoved stops a member the cluster removed, a moment late, so that
// the answer to the removal (when this member was asked for it) reaches the
// client first, as etcd delays its stop.
func (m *Member) stopRemoved() {
	select {
	case <-time.After(time.Second):
	case <-m.done:
	}
	m.fail(errRemoved)
}
