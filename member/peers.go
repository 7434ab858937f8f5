package member

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/strata-kv/strata/datadir"
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

// startPeerServer serves the peer transport and a read-only Cluster
// service (for members that join to learn the cluster) on the peer URLs.
func (m *Member) startPeerServer(cluster pb.ClusterServer, snaps *snapshot.Snapshotter) error {
	peerCreds, peerTLS, err := m.peerOptions()
	if err != nil {
		return err
	}
	t := transport.New(transport.Config{
		TLS:         peerTLS,
		LocalID:     m.memberID,
		ClusterID:   m.clusterID,
		Handler:     snaps.Reports(m.node),
		Snapshotter: snaps,
		Logger:      m.logger.Named("transport"),
	})
	m.transport = t
	m.peerGRPC = grpc.NewServer(append(peerCreds, grpc.MaxRecvMsgSize(1<<30), grpc.MaxSendMsgSize(1<<30))...)
	t.Register(m.peerGRPC)
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
// on the applier goroutine (and once at start-up).
func (m *Member) membersChanged(members []*pb.Member) {
	if m.transport == nil {
		return
	}
	present := map[uint64]bool{}
	self := false
	for _, mem := range members {
		present[mem.ID] = true
		if mem.ID == m.memberID {
			self = true
			continue
		}
		m.transport.AddPeer(mem.ID, mem.PeerURLs)
		m.transport.UpdatePeer(mem.ID, mem.PeerURLs)
	}
	m.peersMu.Lock()
	for id := range m.peers {
		if !present[id] {
			m.transport.RemovePeer(id)
		}
	}
	m.peers = present
	m.peersMu.Unlock()
	if !self && len(members) > 0 && m.wasMember.Load() {
		// Stopping waits for the applier, which runs this: stop from
		// elsewhere, and a moment later, so that the answer to the
		// removal (when this member was asked) reaches the client, as
		// etcd delays its stop.
		go m.stopRemoved()
	}
	if self {
		m.wasMember.Store(true)
	}
}

// discoverCluster asks the peers named in --initial-cluster for the
// cluster this member was added to, and finds this member in it by its
// peer URLs, as etcd does for --initial-cluster-state=existing.
func (m *Member) discoverCluster() (datadir.ID, error) {
	var lastErr error
	for name, urls := range m.cfg.InitialCluster {
		if name == m.cfg.Name {
			continue
		}
		for _, u := range urls {
			addr, err := transport.HostPort(u)
			if err != nil {
				return datadir.ID{}, err
			}
			resp, err := memberList(addr, m.cfg.TLS.Peer.DialCreds(u, m.logger))
			if err != nil {
				lastErr = err
				continue
			}
			for _, mem := range resp.Members {
				if !urlsTaken([]*pb.Member{mem}, m.cfg.AdvertisePeerURLs, 0) {
					continue
				}
				// Until the leader's log or snapshot arrives, these are
				// the peers this member can answer.
				m.discovered = resp.Members
				return datadir.ID{Name: m.cfg.Name, MemberID: mem.ID, ClusterID: resp.Header.GetClusterId(), Joined: true}, nil
			}
			return datadir.ID{}, fmt.Errorf("no member with peer URLs %v in the cluster of %s: add it first (etcdctl member add)", m.cfg.AdvertisePeerURLs, u)
		}
	}
	if lastErr == nil {
		lastErr = errors.New("--initial-cluster names no other member")
	}
	return datadir.ID{}, fmt.Errorf("cannot reach the cluster to join: %w", lastErr)
}

func memberList(addr string, creds credentials.TransportCredentials) (*pb.MemberListResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return pb.NewClusterClient(conn).MemberList(ctx, &pb.MemberListRequest{})
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
		if members, ok := m.peerMemberList(); ok && find(members, m.memberID) == nil {
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

// awaitOwnRemoval polls the peers' member lists until one of this cluster's
// members answers without this member, and then delivers that list.
func (m *Member) awaitOwnRemoval(ctx context.Context) <-chan []*pb.Member {
	out := make(chan []*pb.Member, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-m.done:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if members, ok := m.peerMemberList(); ok && find(members, m.memberID) == nil {
				out <- members
				return
			}
		}
	}()
	return out
}

// peerMemberList asks the other members, in turn, for the member list, and
// returns the first answer from a member of this cluster.
func (m *Member) peerMemberList() ([]*pb.Member, bool) {
	for _, mem := range m.applier.Members() {
		if mem.ID == m.memberID || len(mem.PeerURLs) == 0 {
			continue
		}
		addr, err := transport.HostPort(mem.PeerURLs[0])
		if err != nil {
			continue
		}
		resp, err := memberList(addr, m.cfg.TLS.Peer.DialCreds(mem.PeerURLs[0], m.logger))
		if err != nil || resp.Header.GetClusterId() != m.clusterID {
			continue
		}
		return resp.Members, true
	}
	return nil, false
}
