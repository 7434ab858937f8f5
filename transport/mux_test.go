package transport

import (
	"net"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestMux serves two clusters on one gRPC server: each cluster's member
// reaches the Transport of its own cluster, a stream naming a cluster the
// Mux does not serve, or a member the Transport is not, is refused.
func TestMux(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + lis.Addr().String()
	lg := zaptest.NewLogger(t, zaptest.Level(zapcore.WarnLevel))
	mux := NewMux()
	srv := grpc.NewServer()
	mux.Register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	// The muxed side: member 9 of cluster 0xaa, member 7 of cluster 0xbb.
	hA, hB := newHandler(), newHandler()
	trA := New(Config{LocalID: 9, ClusterID: 0xaa, Handler: hA, Logger: lg})
	trB := New(Config{LocalID: 7, ClusterID: 0xbb, Handler: hB, Logger: lg})
	t.Cleanup(trA.Stop)
	t.Cleanup(trB.Stop)
	for _, tr := range []*Transport{trA, trB} {
		if err := mux.Add(tr); err != nil {
			t.Fatal(err)
		}
	}
	if err := mux.Add(trA); err == nil {
		t.Fatal("a second transport for cluster aa was accepted")
	}

	a := startMember(t, 1, memberOpts{cluster: 0xaa})
	b := startMember(t, 2, memberOpts{cluster: 0xbb})
	c := startMember(t, 3, memberOpts{cluster: 0xcc})
	a.tr.AddPeer(9, []string{url})
	b.tr.AddPeer(7, []string{url})
	trA.AddPeer(1, []string{a.url})
	sendUntilReceived(t, a, &member{id: 9, h: hA})
	sendUntilReceived(t, b, &member{id: 7, h: hB})
	select {
	case m := <-hB.recv:
		if m.GetFrom() != 2 {
			t.Fatalf("cluster bb's transport received from %x", m.GetFrom())
		}
	default:
	}
	// The answer path: the muxed member sends to its peer in cluster aa.
	deadline := time.Now().Add(wait)
	for answered := false; !answered; {
		hb := msg(9, 1, 0)
		hb.Type = raftpb.MessageType_MsgHeartbeat.Enum()
		trA.Send([]*raftpb.Message{hb})
		select {
		case m := <-a.h.recv:
			if m.GetFrom() != 9 {
				t.Fatalf("member 1 received from %x", m.GetFrom())
			}
			answered = true
		case <-time.After(20 * time.Millisecond):
		}
		if !answered && time.Now().After(deadline) {
			t.Fatal("member 1 never received from the muxed member 9")
		}
	}
	tests := []struct {
		name    string
		from    *member
		to      uint64
		wantMsg string
	}{
		{name: "cluster not served", from: c, to: 9, wantMsg: "serves no cluster cc"},
		{name: "other member of a served cluster", from: a, to: 8, wantMsg: "meant for member 8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPeer(tt.from.tr, tt.to, []string{url})
			s, err := p.connect()
			if err == nil {
				s.close()
				t.Fatal("connect succeeded")
			}
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("connect: %v, want FailedPrecondition with %q", err, tt.wantMsg)
			}
		})
	}

	// A removed cluster is refused from then on.
	mux.Remove(0xbb)
	p := newPeer(b.tr, 7, []string{url})
	if s, err := p.connect(); err == nil {
		s.close()
		t.Fatal("connect to a removed cluster succeeded")
	} else if !strings.Contains(err.Error(), ErrClusterIDMismatch.Error()) {
		t.Fatalf("connect to a removed cluster: %v", err)
	}
}
