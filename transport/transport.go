package transport

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Handler receives what peers send. Process is called from transport
// goroutines, concurrently; it must not block for long (the node queues the
// message). The transport never calls the Handler from inside Send, so the
// Handler may wait for the goroutine that calls Send.
type Handler interface {
	Process(ctx context.Context, m *raftpb.Message) error
	ReportUnreachable(id uint64)
	ReportSnapshot(id uint64, status raft.SnapshotStatus)
}

// Snapshotter moves the bulk data of a raft snapshot, which does not travel
// inside the MsgSnap message (m.Snapshot.Data holds only a small descriptor
// the snapshot package defines).
type Snapshotter interface {
	// Open returns the stream of bytes to send after a MsgSnap (the sender
	// side). The transport closes it once, as soon as it has read it to
	// its end or the transfer failed, before waiting for the receiver.
	Open(m *raftpb.Message) (io.ReadCloser, error)
	// Receive consumes that stream on the receiving member and stores it;
	// the transport then calls Handler.Process(m) with the same MsgSnap. An
	// error aborts the transfer and is reported to the sender, which reports
	// raft.SnapshotFailure. r ends with io.EOF only after the sender's last
	// chunk; a transfer cut short ends it with another error, as does one
	// whose sender sent nothing for the stall timeout (5 s) while Read
	// waited. Receive should then release what it staged.
	Receive(m *raftpb.Message, r io.Reader) error
}

// Config configures a Transport.
type Config struct {
	// LocalID is this member's raft ID; ClusterID the cluster's. Both are
	// sent and checked on every stream.
	LocalID, ClusterID uint64
	// Handler receives messages and reports. Required.
	Handler Handler
	// Snapshotter moves snapshot data. nil: MsgSnap fails on both sides.
	Snapshotter Snapshotter
	// Outgoing, if set, is the node's channel of messages to send
	// (node.Node.Outgoing): New starts a goroutine that Sends every slice
	// arriving on it, in order, until Stop.
	Outgoing <-chan []*raftpb.Message
	// DialTimeout bounds connecting to a peer and its handshake. 0: 1 s.
	DialTimeout time.Duration
	// TLS, if set, secures outgoing connections to every peer; the peer
	// gRPC server is configured by its owner. nil: plaintext.
	TLS *tls.Config
	// Logger logs connection changes and failures. nil: no logging.
	Logger *zap.Logger
}

// Tuning. Not wire format: a peer accepts any batch and chunk size up to its
// gRPC server's receive limit.
const (
	// queueSize bounds the messages waiting for one peer's stream; raft
	// retransmits what is dropped when it is full (etcd uses 4096 too).
	queueSize = 4096
	// maxBatchBytes bounds the raft messages put in one frame (at least one
	// message goes in regardless), keeping frames below gRPC's default 4 MiB
	// receive limit for ordinary raft message sizes.
	maxBatchBytes = 1 << 20
	// chunkSize is the amount of snapshot data per frame.
	chunkSize = 1 << 20
	// minBackoff and maxBackoff bound the wait between reconnection
	// attempts; it doubles after each failure.
	minBackoff = 50 * time.Millisecond
	maxBackoff = time.Second
	// keepaliveInterval is how often a member sends an empty frame on each
	// message stream peers opened to it; silenceTimeout how long a sender
	// waits for one before it ends the stream and reconnects, and also how
	// long one frame may take to write (a peer that stopped reading keeps
	// its flow-control window full) before it does the same. On snapshot
	// streams silenceTimeout is the stall timeout: how long a frame may
	// take to write, and a receiver may wait for the next chunk, before the
	// transfer fails. It bounds one frame, not a transfer, so a chunk
	// (chunkSize) must cross the link within it.
	keepaliveInterval = time.Second
	silenceTimeout    = 5 * time.Second
)

// Transport sends raft messages to peers and receives theirs. See the
// package documentation for the streams it keeps.
//
// Concurrency: all methods are safe from any goroutine. New starts only the
// goroutine that reads Config.Outgoing, if set; AddPeer starts the peer's goroutines (a stream writer, a reporter, one
// per snapshot in flight); RemovePeer ends them without waiting. Stop ends
// them and the streams peers opened to this member, and waits for all of
// them, Handler calls in progress included: call it where a Handler call
// cannot be waiting for the caller (after the node stopped, for instance).
type Transport struct {
	cfg   Config
	lg    *zap.Logger
	stopc chan struct{} // closed by Stop

	// keepaliveInterval and silenceTimeout are the constants of the same
	// names; tests shorten them before starting anything.
	keepaliveInterval, silenceTimeout time.Duration

	// wg counts every goroutine the transport starts (goLocked); Stop
	// waits for it.
	wg sync.WaitGroup

	// removedByPeer is closed, once, when a peer refuses this member as
	// removed from the cluster (RemovedByPeer).
	removedByPeer     chan struct{}
	removedByPeerOnce sync.Once

	mu struct {
		sync.Mutex
		peers   map[uint64]*peer
		stopped bool
		// removed are the IDs removed from the cluster (SetRemoved).
		removed map[uint64]bool
	}
}

// New returns a transport for the member cfg.LocalID. It starts only the
// goroutine that reads cfg.Outgoing, if set.
func New(cfg Config) *Transport {
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = time.Second
	}
	lg := cfg.Logger
	if lg == nil {
		lg = zap.NewNop()
	}
	t := &Transport{
		cfg:   cfg,
		lg:    lg.With(zap.String("local-member-id", fmt.Sprintf("%x", cfg.LocalID))),
		stopc: make(chan struct{}),

		keepaliveInterval: keepaliveInterval,
		silenceTimeout:    silenceTimeout,
		removedByPeer:     make(chan struct{}),
	}
	t.mu.peers = make(map[uint64]*peer)
	t.mu.removed = map[uint64]bool{}
	if cfg.Outgoing != nil {
		t.mu.Lock()
		t.goLocked(t.sendOutgoing)
		t.mu.Unlock()
	}
	return t
}

// sendOutgoing sends what the node hands over on Config.Outgoing until
// Stop. Send never blocks, so the node never waits on the network.
func (t *Transport) sendOutgoing() {
	for {
		select {
		case msgs := <-t.cfg.Outgoing:
			t.Send(msgs)
		case <-t.stopc:
			return
		}
	}
}

// Register adds the peer gRPC service to the member's peer gRPC server
// (served on --listen-peer-urls). That server's receive limit
// (grpc.MaxRecvMsgSize, 4 MiB by default) must exceed the largest raft
// message the cluster sends.
func (t *Transport) Register(s *grpc.Server) {
	s.RegisterService(&serviceDesc, t)
}

// AddPeer starts sending to the member id at urls (like
// http://127.0.0.1:2380, tried in turn). It does nothing if id is already a
// peer, is this member, or the transport is stopped.
func (t *Transport) AddPeer(id uint64, urls []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.stopped || id == t.cfg.LocalID || t.mu.peers[id] != nil {
		return
	}
	p := newPeer(t, id, urls)
	t.mu.peers[id] = p
	p.startLocked()
	t.lg.Info("added peer", zap.String("peer-id", fmt.Sprintf("%x", id)), zap.Strings("urls", urls))
}

// UpdatePeer changes the URLs of a peer. The current stream is kept; the
// next connection attempt uses the new URLs.
func (t *Transport) UpdatePeer(id uint64, urls []string) {
	if p := t.peer(id); p != nil {
		p.setURLs(urls)
		t.lg.Info("updated peer", zap.String("peer-id", fmt.Sprintf("%x", id)), zap.Strings("urls", urls))
	}
}

// RemovePeer stops sending to id. Its goroutines end soon after; RemovePeer
// does not wait for them (it may be called from the goroutine a Handler call
// waits for). A snapshot in flight to it is reported as failed.
func (t *Transport) RemovePeer(id uint64) {
	t.mu.Lock()
	p := t.mu.peers[id]
	delete(t.mu.peers, id)
	t.mu.Unlock()
	if p != nil {
		p.stop()
		t.lg.Info("removed peer", zap.String("peer-id", fmt.Sprintf("%x", id)))
	}
}

// SetPeers makes the peers the members other than this one: new ones are
// added, known ones get their current URLs, and peers that are no longer
// members are removed.
func (t *Transport) SetPeers(members []*pb.Member) {
	present := make(map[uint64]bool, len(members))
	for _, mem := range members {
		present[mem.ID] = true
		if mem.ID == t.cfg.LocalID {
			continue
		}
		t.AddPeer(mem.ID, mem.PeerURLs)
		t.UpdatePeer(mem.ID, mem.PeerURLs)
	}
	t.mu.Lock()
	var gone []uint64
	for id := range t.mu.peers {
		if !present[id] {
			gone = append(gone, id)
		}
	}
	t.mu.Unlock()
	for _, id := range gone {
		t.RemovePeer(id)
	}
}

// SetRemoved records the IDs removed from the cluster. A stream from one of
// them is refused, and one served already ends within a keepalive interval,
// with ErrMemberRemoved: the removed member learns it from its peers
// (RemovedByPeer), as etcd's peers answer a removed member with 410 Gone.
// A member whose removal committed may never apply it (the leader stops
// replicating to it), and a member that is only unknown to a peer (one
// that has yet to apply its addition) is not refused.
func (t *Transport) SetRemoved(ids []uint64) {
	removed := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		removed[id] = true
	}
	t.mu.Lock()
	t.mu.removed = removed
	t.mu.Unlock()
}

// isRemoved says whether id was removed from the cluster (SetRemoved).
func (t *Transport) isRemoved(id uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mu.removed[id]
}

// RemovedByPeer is closed once a peer refused a stream from this member
// because the cluster removed it.
func (t *Transport) RemovedByPeer() <-chan struct{} { return t.removedByPeer }

// noteRefusal closes RemovedByPeer if err is a peer's refusal of this
// member as removed.
func (t *Transport) noteRefusal(err error) {
	if st, ok := status.FromError(err); ok && st.Code() == codes.FailedPrecondition &&
		strings.Contains(st.Message(), ErrMemberRemoved.Error()) {
		t.removedByPeerOnce.Do(func() { close(t.removedByPeer) })
	}
}

// Send queues messages; it never blocks the caller (the raft node
// goroutine) and never calls the Handler itself. Per peer, messages wait in a
// bounded queue; when it is full, or while the peer is unreachable, a
// message is dropped and Handler.ReportUnreachable(to) is called soon after
// from a transport goroutine (raft retransmits). Messages to an unknown peer
// are dropped. MsgSnap goes through a separate path that streams
// Snapshotter.Open's bytes in chunks and reports raft.SnapshotFinish or
// SnapshotFailure via Handler.ReportSnapshot when done.
func (t *Transport) Send(msgs []*raftpb.Message) {
	for _, m := range msgs {
		p := t.peer(m.GetTo())
		if p == nil {
			t.lg.Debug("dropped message to unknown peer", zap.String("peer-id", fmt.Sprintf("%x", m.GetTo())), zap.Stringer("type", m.GetType()))
			continue
		}
		if m.GetType() == raftpb.MessageType_MsgSnap {
			p.sendSnapshot(m)
			continue
		}
		p.enqueue(m)
	}
}

// ActiveSince reports when the stream to a peer became healthy (zero if
// not connected): used to refuse membership changes that would lose quorum,
// as etcd does.
func (t *Transport) ActiveSince(id uint64) time.Time {
	if p := t.peer(id); p != nil {
		return p.activeSince()
	}
	return time.Time{}
}

// Stop ends every peer's goroutines and every incoming stream, and waits for
// them. Send and AddPeer do nothing afterwards.
func (t *Transport) Stop() {
	t.mu.Lock()
	if t.mu.stopped {
		t.mu.Unlock()
		return
	}
	t.mu.stopped = true
	peers := t.mu.peers
	t.mu.peers = make(map[uint64]*peer)
	close(t.stopc)
	t.mu.Unlock()
	for _, p := range peers {
		p.stop()
	}
	t.wg.Wait()
}

// goLocked runs f on a goroutine counted in t.wg.
//
// REQUIRES: t.mu held and the transport not stopped, so that no Add races
// with Stop's Wait.
func (t *Transport) goLocked(f func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
}

// goUnlessStopped runs f on a goroutine counted in t.wg, unless the
// transport is stopped; it reports whether it did.
func (t *Transport) goUnlessStopped(f func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.stopped {
		return false
	}
	t.goLocked(f)
	return true
}

func (t *Transport) peer(id uint64) *peer {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mu.peers[id]
}

// dial returns a client connection to one peer URL. gRPC connects lazily, on
// the first stream; MinConnectTimeout makes a silent peer fail that attempt
// after DialTimeout. Every stream gets its own connection, so a snapshot
// never shares a TCP connection (and its congestion) with heartbeats.
func (t *Transport) dial(rawURL string) (*grpc.ClientConn, error) {
	addr := rawURL
	if strings.Contains(rawURL, "://") {
		u, err := url.Parse(rawURL)
		if err != nil {
			return nil, fmt.Errorf("parse peer URL %q: %w", rawURL, err)
		}
		addr = u.Host
	}
	creds := insecure.NewCredentials()
	if t.cfg.TLS != nil {
		creds = credentials.NewTLS(t.cfg.TLS)
	}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: minBackoff, Multiplier: 2, Jitter: 0.2, MaxDelay: maxBackoff},
			MinConnectTimeout: t.cfg.DialTimeout,
		}),
		grpc.WithDefaultCallOptions(grpc.CallContentSubtype(codecName)),
	)
	if err != nil {
		return nil, fmt.Errorf("dial peer %s: %w", rawURL, err)
	}
	return conn, nil
}
