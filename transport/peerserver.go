package transport

import (
	"net"

	"google.golang.org/grpc"
)

// PeerService is a gRPC service a member answers its peers on the peer URLs
// besides raft's: the Cluster service for members that join, HashKV for the
// corruption check.
type PeerService interface {
	RegisterPeer(*grpc.Server)
}

// PeerServerConfig is what NewPeerServer serves.
type PeerServerConfig struct {
	// URLs are the --listen-peer-urls, bound with Sockets' options.
	URLs    []string
	Sockets ListenConfig
	// Creds are the peer gRPC server's credentials
	// (tlsconfig.Config.PeerServing).
	Creds []grpc.ServerOption
	// Transport receives raft's messages and snapshots.
	Transport *Transport
	Services  []PeerService
}

// PeerServer serves the peer URLs.
//
// Concurrency: NewPeerServer, then Serve or Close, then Stop, from the
// goroutine that starts and stops the member.
type PeerServer struct {
	grpc      *grpc.Server
	listeners []net.Listener
}

// maxPeerMessageBytes bounds one message between peers: a snapshot is
// streamed in chunks, but a MsgApp may carry a large batch of entries.
const maxPeerMessageBytes = 1 << 30

// NewPeerServer registers the transport and the services and binds the
// URLs; Serve serves them.
func NewPeerServer(cfg PeerServerConfig) (*PeerServer, error) {
	s := &PeerServer{grpc: grpc.NewServer(append(cfg.Creds,
		grpc.MaxRecvMsgSize(maxPeerMessageBytes), grpc.MaxSendMsgSize(maxPeerMessageBytes))...)}
	cfg.Transport.Register(s.grpc)
	for _, svc := range cfg.Services {
		svc.RegisterPeer(s.grpc)
	}
	var err error
	if s.listeners, err = cfg.Sockets.Listen("peer", cfg.URLs); err != nil {
		return nil, err
	}
	return s, nil
}

// Serve serves every listener on its own goroutine and returns; Stop ends
// them.
func (s *PeerServer) Serve() {
	for _, l := range s.listeners {
		go func() { _ = s.grpc.Serve(l) }()
	}
}

// Stop stops serving at once and closes the listeners.
func (s *PeerServer) Stop() { s.grpc.Stop() }

// Close closes the listeners of a server that will not be served.
func (s *PeerServer) Close() {
	for _, l := range s.listeners {
		l.Close()
	}
}
