package transport

import (
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Mux serves the peer service for several Transports on one gRPC server, one
// per cluster: a process that is a member of several clusters (a logger,
// docs/logger.md) has one peer URL for all of them. It reads the hello of
// every incoming stream and hands the stream to the Transport whose
// ClusterID the hello names; that Transport then checks the hello (the
// member it is meant for) and serves the stream as it would alone. A hello
// naming a cluster the Mux does not serve is refused with
// ErrClusterIDMismatch, as a member refuses a stream from another cluster.
//
// Outgoing streams are each Transport's own: a Mux only routes incoming
// ones. Transports added to a Mux must not be registered on a gRPC server
// themselves.
//
// Concurrency: all methods are safe from any goroutine.
type Mux struct {
	mu struct {
		sync.Mutex
		byCluster map[uint64]*Transport
	}
}

// NewMux returns a Mux serving no cluster yet.
func NewMux() *Mux {
	m := &Mux{}
	m.mu.byCluster = make(map[uint64]*Transport)
	return m
}

// Register adds the peer service to a gRPC server, once for every
// Transport the Mux will serve (see Transport.Register).
func (m *Mux) Register(s *grpc.Server) {
	s.RegisterService(&serviceDesc, m)
}

// Add routes the streams of t's cluster to t. It refuses a second
// Transport for the same cluster.
func (m *Mux) Add(t *Transport) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := t.cfg.ClusterID
	if m.mu.byCluster[id] != nil {
		return fmt.Errorf("transport mux: cluster %x is already served", id)
	}
	m.mu.byCluster[id] = t
	return nil
}

// Remove stops routing the streams of a cluster; streams already handed
// over go on until their Transport stops.
func (m *Mux) Remove(clusterID uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.mu.byCluster, clusterID)
}

func (m *Mux) route(hello *frame) (*Transport, error) {
	m.mu.Lock()
	t := m.mu.byCluster[hello.ClusterID]
	m.mu.Unlock()
	if t == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%v: this process serves no cluster %x (stream from member %x to member %x)",
			ErrClusterIDMismatch, hello.ClusterID, hello.From, hello.To)
	}
	return t, nil
}

func (m *Mux) serveMessages(s grpc.ServerStream) error {
	hello, err := readHello(s, "messages")
	if err != nil {
		return err
	}
	t, err := m.route(hello)
	if err != nil {
		return err
	}
	return t.serveMessagesAfter(s, hello)
}

func (m *Mux) serveSnapshot(s grpc.ServerStream) error {
	hello, err := readHello(s, "snapshot")
	if err != nil {
		return err
	}
	t, err := m.route(hello)
	if err != nil {
		return err
	}
	return t.serveSnapshotAfter(s, hello)
}
