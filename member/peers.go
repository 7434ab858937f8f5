package member

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
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
func (m *Member) startPeerServer(cluster pb.ClusterServer, snaps *snapshotter) error {
	peerCreds, peerTLS, err := m.peerOptions()
	if err != nil {
		return err
	}
	t := transport.New(transport.Config{
		TLS:         peerTLS,
		LocalID:     m.memberID,
		ClusterID:   m.clusterID,
		Handler:     snapshotReports{Handler: m.node, s: snaps},
		Snapshotter: snaps,
		Logger:      m.logger.Named("transport"),
	})
	m.transport = t
	m.peerGRPC = grpc.NewServer(append(peerCreds, grpc.MaxRecvMsgSize(1<<30), grpc.MaxSendMsgSize(1<<30))...)
	t.Register(m.peerGRPC)
	pb.RegisterClusterServer(m.peerGRPC, cluster)
	for _, u := range m.cfg.ListenPeerURLs {
		addr, err := hostPort(u)
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
			addr, err := hostPort(u)
			if err != nil {
				return datadir.ID{}, err
			}
			resp, err := memberList(addr, m.dialCreds(u, m.cfg.TLS.Peer))
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

// snapshotter moves raft snapshots for the transport: the leader streams a
// consistent export of its engine, or the compacted log batches that cover
// the member's gap when that is smaller (incremental.go); the follower
// stages the data (a table, or the decoded batches) that the applier
// installs when raft hands the snapshot over.
//
// Concurrency: Open, Receive and reported run on transport goroutines,
// install on the applier goroutine; the maps are guarded by their mutexes.
type snapshotter struct {
	m       *Member
	metrics *snapshotMetrics
	send    sendState

	mu     sync.Mutex
	staged map[uint64]stagedSnapshot // snapshot index -> staged data; guarded by mu
}

// stagedSnapshot is a received snapshot waiting for raft: a table to
// ingest (full) or a decoded incremental stream.
type stagedSnapshot struct {
	path string
	inc  *snapshot.Incremental
}

func newSnapshotter(m *Member) *snapshotter {
	s := &snapshotter{m: m, staged: map[uint64]stagedSnapshot{}}
	s.send.pending = map[uint64]*outgoing{}
	s.send.forceFull = map[uint64]bool{}
	var reg *prometheus.Registry
	if m.web != nil {
		reg = m.web.metrics.Registry()
	}
	s.metrics = newSnapshotMetrics(reg, m.logger)
	return s
}

func (s *snapshotter) dir() string { return datadir.Snap(s.m.cfg.DataDir) }

// Open implements transport.Snapshotter: an incremental stream if one can
// and should be sent (incremental.go), else every key of an engine view.
func (s *snapshotter) Open(msg *raftpb.Message) (io.ReadCloser, error) {
	index := msg.GetSnapshot().GetMetadata().GetIndex()
	kind := snapshot.KindIncremental
	rc, view, reason := s.openIncremental(msg)
	if rc == nil {
		kind = snapshot.KindFull
		s.m.logger.Info("sending full snapshot", zap.String("to", fmt.Sprintf("%x", msg.GetTo())),
			zap.Uint64("index", index), zap.String("reason", reason))
		var err error
		if rc, err = s.openFull(index, view); err != nil {
			return nil, err
		}
	}
	out := &outgoing{kind: kind, index: index}
	s.send.mu.Lock()
	s.send.pending[msg.GetTo()] = out
	s.send.mu.Unlock()
	return &countingReader{ReadCloser: rc, out: out}, nil
}

// openFull streams every key of view (or of a new engine view if nil).
func (s *snapshotter) openFull(index uint64, view fullView) (io.ReadCloser, error) {
	if view == nil {
		v, err := s.m.engine.NewExportView()
		if err != nil {
			return nil, err
		}
		view = v
	}
	if view.AppliedIndex() < index {
		view.Close()
		return nil, fmt.Errorf("engine at %d is behind snapshot index %d", view.AppliedIndex(), index)
	}
	pr, pw := io.Pipe()
	go func() {
		err := snapshot.Write(pw, view.AppliedIndex(), view.ForEach)
		view.Close()
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// Receive implements transport.Snapshotter. The first bytes say which
// stream it is.
func (s *snapshotter) Receive(msg *raftpb.Message, r io.Reader) error {
	br := bufio.NewReaderSize(r, 1<<20)
	if prefix, _ := br.Peek(len(snapshot.IncrementalMagic)); snapshot.Kind(prefix) == snapshot.KindIncremental {
		return s.receiveIncremental(msg, br)
	}
	return s.receiveFull(msg, br)
}

// receiveFull writes a full stream into a table to ingest.
func (s *snapshotter) receiveFull(msg *raftpb.Message, r io.Reader) error {
	index := msg.GetSnapshot().GetMetadata().GetIndex()
	if err := s.m.cfg.FS.MkdirAll(s.dir(), 0o700); err != nil {
		return fmt.Errorf("create snapshot dir: %w", err)
	}
	path := filepath.Join(s.dir(), fmt.Sprintf("%016x-%016x.sst", msg.GetSnapshot().GetMetadata().GetTerm(), index))
	w, err := s.m.engine.NewSnapshotWriter(path)
	if err != nil {
		return err
	}
	cr := &byteCounter{r: r}
	applied, records, err := snapshot.Read(cr, w)
	if err == nil && applied < index {
		err = fmt.Errorf("snapshot stream holds index %d, below the snapshot's %d", applied, index)
	}
	if err != nil {
		w.Abort()
		_ = s.m.cfg.FS.Remove(path)
		return err
	}
	if err := w.Finish(); err != nil {
		_ = s.m.cfg.FS.Remove(path)
		return err
	}
	s.stage(index, stagedSnapshot{path: path})
	s.metrics.received.WithLabelValues(snapshot.KindFull).Inc()
	s.metrics.receivedBytes.WithLabelValues(snapshot.KindFull).Add(float64(cr.n))
	s.m.logger.Info("received snapshot", zap.Uint64("index", index), zap.Uint64("engine-index", applied),
		zap.Uint64("records", records), zap.Int64("bytes", cr.n))
	return nil
}

// byteCounter counts the bytes read through it.
type byteCounter struct {
	r io.Reader
	n int64
}

func (c *byteCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// stage keeps st for the snapshot at index, replacing what was staged for
// it, and drops what was staged for snapshots the engine has passed (raft
// ignores a snapshot at or below the commit index, so those are never
// installed).
func (s *snapshotter) stage(index uint64, st stagedSnapshot) {
	applied := s.m.applier.AppliedIndex()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, old := range s.staged {
		if i == index || i <= applied {
			s.discardLocked(i, old)
		}
	}
	s.staged[index] = st
}

// discardLocked forgets a staged snapshot and removes its table.
// REQUIRES: s.mu held.
func (s *snapshotter) discardLocked(index uint64, st stagedSnapshot) {
	delete(s.staged, index)
	if st.path != "" {
		_ = s.m.cfg.FS.Remove(st.path)
	}
}

// Install implements apply.Installer: it replaces the state machine with the staged snapshot for snap,
// or brings it there with a staged incremental one. It runs on the
// applier goroutine.
func (s *snapshotter) Install(snap *raftpb.Snapshot) error {
	index := snap.GetMetadata().GetIndex()
	s.mu.Lock()
	st, ok := s.staged[index]
	delete(s.staged, index)
	for i, old := range s.staged {
		if i < index {
			s.discardLocked(i, old)
		}
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("no staged data for snapshot at index %d", index)
	}
	if st.inc != nil {
		return s.installIncremental(snap, st.inc)
	}
	err := s.m.store.Replace(func() error {
		_, err := s.m.engine.InstallSnapshot(st.path)
		return err
	})
	if err != nil {
		return err
	}
	_ = s.m.cfg.FS.Remove(st.path)
	return nil
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
		addr, err := hostPort(mem.PeerURLs[0])
		if err != nil {
			continue
		}
		resp, err := memberList(addr, m.dialCreds(mem.PeerURLs[0], m.cfg.TLS.Peer))
		if err != nil || resp.Header.GetClusterId() != m.clusterID {
			continue
		}
		return resp.Members, true
	}
	return nil, false
}
