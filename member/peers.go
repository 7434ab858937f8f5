package member

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/strata-kv/strata/snapshot"
	"github.com/strata-kv/strata/transport"
)

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
		Outgoing:    m.node.Outgoing(),
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
	m.peerListeners, err = m.cfg.Sockets.Listen("peer", m.cfg.ListenPeerURLs)
	return err
}
