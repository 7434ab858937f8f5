package transport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// wait bounds every wait for something a transport goroutine does.
const wait = 10 * time.Second

type snapReport struct {
	id     uint64
	status raft.SnapshotStatus
}

// handler records what a transport hands it, on buffered channels.
type handler struct {
	recv        chan *raftpb.Message
	unreachable chan uint64
	snaps       chan snapReport
}

func newHandler() *handler {
	return &handler{
		recv:        make(chan *raftpb.Message, 10000),
		unreachable: make(chan uint64, 1000),
		snaps:       make(chan snapReport, 10),
	}
}

func (h *handler) Process(ctx context.Context, m *raftpb.Message) error {
	select {
	case h.recv <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *handler) ReportUnreachable(id uint64) {
	select {
	case h.unreachable <- id:
	default:
	}
}

func (h *handler) ReportSnapshot(id uint64, s raft.SnapshotStatus) { h.snaps <- snapReport{id, s} }

// snapshotter serves data from Open and records a checksum of what Receive
// reads.
type snapshotter struct {
	data      []byte
	failAfter int   // Open's reader fails after this many bytes; 0: never
	recvErr   error // Receive returns it after reading everything

	returned chan error // what each Receive returned

	mu       sync.Mutex
	received map[uint64][32]byte // snapshot index -> sha256 of the data received
	recvErrs []error             // errors Receive's reader returned
}

func (s *snapshotter) Open(m *raftpb.Message) (io.ReadCloser, error) {
	var r io.Reader = bytes.NewReader(s.data)
	if s.failAfter > 0 {
		r = io.MultiReader(io.LimitReader(r, int64(s.failAfter)), errReader{})
	}
	return io.NopCloser(r), nil
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func (s *snapshotter) Receive(m *raftpb.Message, r io.Reader) (err error) {
	defer func() { s.returned <- err }()
	h := sha256.New()
	_, err = io.Copy(h, r)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.recvErrs = append(s.recvErrs, err)
		return err
	}
	if s.recvErr != nil {
		return s.recvErr
	}
	if s.received == nil {
		s.received = make(map[uint64][32]byte)
	}
	s.received[m.GetSnapshot().GetMetadata().GetIndex()] = [32]byte(h.Sum(nil))
	return nil
}

// member is a transport serving on a real gRPC server on loopback.
type member struct {
	id   uint64
	tr   *Transport
	h    *handler
	url  string
	addr string
	srv  *grpc.Server
}

type memberOpts struct {
	cluster uint64
	snap    Snapshotter
	logger  *zap.Logger
	// silence and keepalive, if set, replace the transport's
	// silenceTimeout and keepaliveInterval.
	silence, keepalive time.Duration
	// serverOpts configure the member's gRPC server.
	serverOpts []grpc.ServerOption
}

func startMember(t *testing.T, id uint64, o memberOpts) *member {
	t.Helper()
	if o.cluster == 0 {
		o.cluster = 0xc1
	}
	if o.logger == nil {
		o.logger = zaptest.NewLogger(t, zaptest.Level(zapcore.WarnLevel))
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := newHandler()
	m := &member{id: id, h: h, addr: lis.Addr().String(), url: "http://" + lis.Addr().String()}
	m.tr = New(Config{LocalID: id, ClusterID: o.cluster, Handler: h, Snapshotter: o.snap, Logger: o.logger})
	if o.silence > 0 {
		m.tr.silenceTimeout = o.silence
	}
	if o.keepalive > 0 {
		m.tr.keepaliveInterval = o.keepalive
	}
	m.serve(t, lis, o.serverOpts...)
	t.Cleanup(func() {
		m.tr.Stop()
		m.srv.Stop()
	})
	return m
}

func (m *member) serve(t *testing.T, lis net.Listener, opts ...grpc.ServerOption) {
	m.srv = grpc.NewServer(opts...)
	m.tr.Register(m.srv)
	srv := m.srv
	go func() { _ = srv.Serve(lis) }()
}

// connect makes every member a peer of every other.
func connect(ms ...*member) {
	for _, a := range ms {
		for _, b := range ms {
			a.tr.AddPeer(b.id, []string{b.url})
		}
	}
}

func msg(from, to, index uint64) *raftpb.Message {
	return &raftpb.Message{
		Type:  raftpb.MessageType_MsgApp.Enum(),
		From:  proto.Uint64(from),
		To:    proto.Uint64(to),
		Index: proto.Uint64(index),
	}
}

// recvN waits for n messages on h and returns them, skipping the heartbeats
// of sendUntilReceived.
func recvN(t *testing.T, h *handler, n int) []*raftpb.Message {
	t.Helper()
	timeout := time.After(wait)
	var got []*raftpb.Message
	for len(got) < n {
		select {
		case m := <-h.recv:
			if m.GetType() != raftpb.MessageType_MsgHeartbeat {
				got = append(got, m)
			}
		case <-timeout:
			t.Fatalf("received %d messages, want %d", len(got), n)
		}
	}
	return got
}

// sendUntilReceived sends heartbeats from a to b until b receives one: the
// stream may not be up yet, and messages queued before it is are dropped.
// Later heartbeats may still be in flight when it returns.
func sendUntilReceived(t *testing.T, a, b *member) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		hb := msg(a.id, b.id, 0)
		hb.Type = raftpb.MessageType_MsgHeartbeat.Enum()
		a.tr.Send([]*raftpb.Message{hb})
		select {
		case <-b.h.recv:
			return
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("member %x never received from %x", b.id, a.id)
		}
	}
}

// drain empties h's receive channel.
func drain(h *handler) {
	for {
		select {
		case <-h.recv:
		default:
			return
		}
	}
}

func TestExchange(t *testing.T) {
	tests := []struct {
		name    string
		members int
	}{
		{name: "two", members: 2},
		{name: "three", members: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ms []*member
			for i := range tt.members {
				ms = append(ms, startMember(t, uint64(i+1), memberOpts{}))
			}
			connect(ms...)
			for _, a := range ms {
				for _, b := range ms {
					if a != b {
						sendUntilReceived(t, a, b)
					}
				}
			}
			for _, b := range ms {
				drain(b.h)
			}
			// Every member sends 100 messages to every other in one Send;
			// each receiver gets each sender's in order.
			const n = 100
			for _, a := range ms {
				var msgs []*raftpb.Message
				for i := range uint64(n) {
					for _, b := range ms {
						if a != b {
							msgs = append(msgs, msg(a.id, b.id, i))
						}
					}
				}
				a.tr.Send(msgs)
			}
			for _, b := range ms {
				got := recvN(t, b.h, n*(len(ms)-1))
				next := map[uint64]uint64{}
				for _, m := range got {
					if m.GetTo() != b.id {
						t.Fatalf("member %x received a message for %x", b.id, m.GetTo())
					}
					if m.GetIndex() != next[m.GetFrom()] {
						t.Fatalf("member %x: from %x got index %d, want %d", b.id, m.GetFrom(), m.GetIndex(), next[m.GetFrom()])
					}
					next[m.GetFrom()]++
				}
			}
			for _, a := range ms {
				for _, b := range ms {
					if a != b && a.tr.ActiveSince(b.id).IsZero() {
						t.Errorf("ActiveSince(%x) at %x is zero with the stream up", b.id, a.id)
					}
				}
			}
		})
	}
}

// TestManyMessagesInOrder sends more messages at once than one frame holds
// (by count and by bytes) and checks that all arrive in order.
func TestManyMessagesInOrder(t *testing.T) {
	a, b := startMember(t, 1, memberOpts{}), startMember(t, 2, memberOpts{})
	connect(a, b)
	sendUntilReceived(t, a, b)
	drain(b.h)
	const n = 3000
	msgs := make([]*raftpb.Message, n)
	for i := range msgs {
		msgs[i] = msg(1, 2, uint64(i))
		// Some 4 KiB entries, so that the batch spans several frames.
		msgs[i].Entries = []*raftpb.Entry{{Data: make([]byte, 4096)}}
	}
	a.tr.Send(msgs)
	for i, m := range recvN(t, b.h, n) {
		if m.GetIndex() != uint64(i) || len(m.GetEntries()) != 1 || len(m.GetEntries()[0].GetData()) != 4096 {
			t.Fatalf("message %d: got index %d with %d entries", i, m.GetIndex(), len(m.GetEntries()))
		}
	}
}

// fakeStream records the frames a peer's writer sends.
type fakeStream struct {
	grpc.ClientStream
	frames [][]*raftpb.Message
	total  int
	want   int
	done   func()
}

func (s *fakeStream) SendMsg(v any) error {
	f := v.(*frame)
	// The writer reuses its batch slice after SendMsg returns, as gRPC
	// allows; gRPC has marshalled it by then, the fake copies it.
	s.frames = append(s.frames, append([]*raftpb.Message(nil), f.Msgs...))
	s.total += len(f.Msgs)
	if s.total >= s.want {
		s.done()
	}
	return nil
}

func TestBatching(t *testing.T) {
	tests := []struct {
		name       string
		n          int
		entryBytes int
		wantFrames int
	}{
		{name: "small messages queued before the stream is ready share one frame", n: 1000, wantFrames: 1},
		{name: "a frame holds at least one message however large", n: 3, entryBytes: 2 * maxBatchBytes, wantFrames: 3},
		// 256 KiB entries: four reach maxBatchBytes, so frames hold four.
		{name: "frames stop at maxBatchBytes", n: 10, entryBytes: 256 << 10, wantFrames: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := New(Config{LocalID: 1, ClusterID: 1, Handler: newHandler()})
			p := newPeer(tr, 2, nil)
			for i := range tt.n {
				m := msg(1, 2, uint64(i))
				if tt.entryBytes > 0 {
					m.Entries = []*raftpb.Entry{{Data: make([]byte, tt.entryBytes)}}
				}
				p.enqueue(m)
			}
			fs := &fakeStream{want: tt.n, done: p.end}
			err := p.pump(&outStream{cs: fs, done: make(chan struct{})})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("pump: %v, want context.Canceled", err)
			}
			if len(fs.frames) != tt.wantFrames {
				t.Errorf("got %d frames, want %d", len(fs.frames), tt.wantFrames)
			}
			var i uint64
			for _, f := range fs.frames {
				for _, m := range f {
					if m.GetIndex() != i {
						t.Fatalf("message %d has index %d", i, m.GetIndex())
					}
					i++
				}
			}
		})
	}
}

func TestQueueFull(t *testing.T) {
	h := newHandler()
	tr := New(Config{LocalID: 1, ClusterID: 1, Handler: h})
	p := newPeer(tr, 2, nil)
	for i := range queueSize + 1 {
		p.enqueue(msg(1, 2, uint64(i)))
	}
	// Only the report goroutine: the writer would drain the queue.
	tr.goUnlessStopped(p.report)
	defer func() {
		p.stop()
		tr.Stop()
	}()
	select {
	case id := <-h.unreachable:
		if id != 2 {
			t.Fatalf("ReportUnreachable(%x), want 2", id)
		}
	case <-time.After(wait):
		t.Fatal("a full queue was not reported")
	}
	if len(p.queue) != queueSize {
		t.Fatalf("queue holds %d messages, want %d", len(p.queue), queueSize)
	}
}

func TestPeerDownAndBack(t *testing.T) {
	a, b := startMember(t, 1, memberOpts{}), startMember(t, 2, memberOpts{})
	connect(a, b)
	sendUntilReceived(t, a, b)

	// b goes away: its server stops, its transport too.
	b.tr.Stop()
	b.srv.Stop()
	deadline := time.Now().Add(wait)
	for !a.tr.ActiveSince(2).IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("ActiveSince(2) still set after the peer stopped")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for len(a.h.unreachable) > 0 {
		<-a.h.unreachable
	}
	a.tr.Send([]*raftpb.Message{msg(1, 2, 1)})
	select {
	case id := <-a.h.unreachable:
		if id != 2 {
			t.Fatalf("ReportUnreachable(%x), want 2", id)
		}
	case <-time.After(wait):
		t.Fatal("message to a stopped peer was not reported unreachable")
	}

	// b comes back on the same address with a new transport.
	lis, err := net.Listen("tcp", b.addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", b.addr, err)
	}
	b2 := &member{id: 2, h: newHandler(), url: b.url, addr: b.addr}
	b2.tr = New(Config{LocalID: 2, ClusterID: 0xc1, Handler: b2.h, Logger: zaptest.NewLogger(t, zaptest.Level(zapcore.WarnLevel))})
	b2.serve(t, lis)
	t.Cleanup(func() {
		b2.tr.Stop()
		b2.srv.Stop()
	})
	sendUntilReceived(t, a, b2)
	if a.tr.ActiveSince(2).IsZero() {
		t.Fatal("ActiveSince(2) is zero after reconnection")
	}
}

func TestClusterIDMismatch(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	a := startMember(t, 1, memberOpts{cluster: 0xaa, logger: zap.New(core)})
	b := startMember(t, 2, memberOpts{cluster: 0xbb})
	c := startMember(t, 4, memberOpts{cluster: 0xaa})

	tests := []struct {
		name    string
		peer    uint64
		url     string
		wantMsg string
	}{
		{name: "other cluster", peer: 2, url: b.url, wantMsg: "cluster ID mismatch"},
		{name: "other member at the URL", peer: 3, url: c.url, wantMsg: "meant for member 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPeer(a.tr, tt.peer, []string{tt.url})
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

	// Through the public API: nothing arrives, the stream never becomes
	// active, the refusal is logged.
	a.tr.AddPeer(2, []string{b.url})
	deadline := time.Now().Add(wait)
	for logs.FilterMessage("cannot open message stream to peer").FilterFieldKey("error").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("refusal not logged")
		}
		time.Sleep(5 * time.Millisecond)
	}
	entry := logs.FilterMessage("cannot open message stream to peer").All()[0]
	if errMsg := fmt.Sprint(entry.ContextMap()["error"]); !strings.Contains(errMsg, "cluster ID mismatch") {
		t.Errorf("logged %q, want a cluster ID mismatch", errMsg)
	}
	a.tr.Send([]*raftpb.Message{msg(1, 2, 1)})
	if !a.tr.ActiveSince(2).IsZero() {
		t.Error("ActiveSince is set for a peer of another cluster")
	}
	select {
	case m := <-b.h.recv:
		t.Fatalf("member of another cluster received %v", m)
	default:
	}
}

// TestForgedSenderRefused: a message on a peer's stream must be from that
// peer and for this member; one naming another sender (a peer speaking for
// a third member, or a forged local message) ends the stream, and raft never
// sees it. Every message used to go to raft as it came (found by review).
func TestForgedSenderRefused(t *testing.T) {
	a := startMember(t, 1, memberOpts{})
	b := startMember(t, 2, memberOpts{})
	a.tr.AddPeer(2, []string{b.url})
	a.tr.Send([]*raftpb.Message{msg(3, 2, 1)})
	deadline := time.Now().Add(wait)
	for {
		a.tr.Send([]*raftpb.Message{msg(1, 2, 2)})
		select {
		case m := <-b.h.recv:
			if m.GetFrom() != 1 {
				t.Fatalf("member 2 processed %v, sent on member 1's stream", m)
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("member 1's own message never arrived")
		}
	}
}

func snapMsg(from, to, index uint64) *raftpb.Message {
	return &raftpb.Message{
		Type: raftpb.MessageType_MsgSnap.Enum(),
		From: proto.Uint64(from),
		To:   proto.Uint64(to),
		Snapshot: &raftpb.Snapshot{
			Data:     []byte("descriptor"),
			Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(index), Term: proto.Uint64(3)},
		},
	}
}

func TestSnapshot(t *testing.T) {
	data := make([]byte, 5<<20+12345) // several chunks and a short last one
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	tests := []struct {
		name       string
		data       []byte
		failAfter  int
		recvErr    error
		nilSnap    bool // the receiver has no Snapshotter
		wantStatus raft.SnapshotStatus
	}{
		{name: "several MiB", data: data, wantStatus: raft.SnapshotFinish},
		{name: "empty", data: nil, wantStatus: raft.SnapshotFinish},
		{name: "Receive fails", data: data, recvErr: errors.New("no space"), wantStatus: raft.SnapshotFailure},
		{name: "sender's data fails midway", data: data, failAfter: 2 << 20, wantStatus: raft.SnapshotFailure},
		{name: "receiver cannot take snapshots", data: data, nilSnap: true, wantStatus: raft.SnapshotFailure},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			send := &snapshotter{data: tt.data, failAfter: tt.failAfter}
			recv := &snapshotter{recvErr: tt.recvErr, returned: make(chan error, 1)}
			var recvSnap Snapshotter = recv
			if tt.nilSnap {
				recvSnap = nil
			}
			a := startMember(t, 1, memberOpts{snap: send})
			b := startMember(t, 2, memberOpts{snap: recvSnap})
			connect(a, b)
			sendUntilReceived(t, a, b)
			drain(b.h)

			a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 42)})
			select {
			case r := <-a.h.snaps:
				if r != (snapReport{2, tt.wantStatus}) {
					t.Fatalf("ReportSnapshot%v, want status %v", r, tt.wantStatus)
				}
			case <-time.After(wait):
				t.Fatal("snapshot not reported")
			}
			if !tt.nilSnap {
				select {
				case err := <-recv.returned:
					if (err == nil) != (tt.wantStatus == raft.SnapshotFinish) {
						t.Fatalf("Receive returned %v with the sender reporting %v", err, tt.wantStatus)
					}
				case <-time.After(wait):
					t.Fatal("Receive did not return")
				}
			}
			recv.mu.Lock()
			sum, ok := recv.received[42]
			recvErrs := recv.recvErrs
			recv.mu.Unlock()
			if tt.wantStatus == raft.SnapshotFinish {
				if !ok || sum != sha256.Sum256(tt.data) {
					t.Fatal("received data differs from what was sent")
				}
				m := recvN(t, b.h, 1)[0]
				if m.GetType() != raftpb.MessageType_MsgSnap || m.GetSnapshot().GetMetadata().GetIndex() != 42 || string(m.GetSnapshot().GetData()) != "descriptor" {
					t.Fatalf("Process got %v, want the MsgSnap", m)
				}
				return
			}
			if ok {
				t.Fatal("a failed transfer was stored")
			}
			if tt.failAfter > 0 && len(recvErrs) == 0 {
				t.Error("Receive read a transfer the sender aborted without an error")
			}
			for len(b.h.recv) > 0 {
				if m := <-b.h.recv; m.GetType() == raftpb.MessageType_MsgSnap {
					t.Fatalf("Process got %v after a failed transfer", m)
				}
			}
		})
	}
}

func TestRemovePeerAndStop(t *testing.T) {
	a, b := startMember(t, 1, memberOpts{}), startMember(t, 2, memberOpts{})
	connect(a, b)
	sendUntilReceived(t, a, b)
	a.tr.RemovePeer(2)
	if !a.tr.ActiveSince(2).IsZero() {
		t.Error("ActiveSince of a removed peer is set")
	}
	a.tr.Send([]*raftpb.Message{msg(1, 2, 1)}) // dropped: unknown peer
	a.tr.AddPeer(2, []string{b.url})
	sendUntilReceived(t, a, b)

	b.tr.Stop()
	b.tr.Stop() // idempotent
	b.tr.AddPeer(1, []string{a.url})
	if b.tr.peer(1) != nil {
		t.Error("AddPeer after Stop added a peer")
	}
}

// blockingHandler's ReportUnreachable waits for release, as a node's does
// while its goroutine is busy.
type blockingHandler struct {
	*handler
	called  chan struct{}
	release chan struct{}
}

func (h *blockingHandler) ReportUnreachable(id uint64) {
	h.called <- struct{}{}
	<-h.release
}

// TestHandlerMayWaitForCaller checks that neither Send nor RemovePeer waits
// for a Handler call: the node calls both from the goroutine its Handler
// methods wait for.
func TestHandlerMayWaitForCaller(t *testing.T) {
	h := &blockingHandler{handler: newHandler(), called: make(chan struct{}, 1), release: make(chan struct{})}
	tr := New(Config{LocalID: 1, ClusterID: 1, Handler: h, DialTimeout: 100 * time.Millisecond})
	defer tr.Stop()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close() // nothing listens there now
	tr.AddPeer(2, []string{"http://" + dead})
	tr.Send([]*raftpb.Message{msg(1, 2, 1)})
	select {
	case <-h.called:
	case <-time.After(wait):
		t.Fatal("no unreachable report")
	}
	// The report goroutine is blocked in the Handler.
	for i := range queueSize + 10 {
		tr.Send([]*raftpb.Message{msg(1, 2, uint64(i))})
	}
	tr.Send([]*raftpb.Message{snapMsg(1, 2, 5)})
	tr.RemovePeer(2)
	close(h.release)
}

// TestSilentPeer checks that a peer which accepts the stream but then sends
// nothing (no keepalives: a hung machine or a one-way partition) is taken
// for gone after silenceTimeout, and the stream reopened.
func TestSilentPeer(t *testing.T) {
	// A fake member 2: answers the hello, reads everything, never writes.
	hellos := make(chan struct{}, 100)
	silent := grpc.ServiceDesc{
		ServiceName: serviceName,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName: "Messages",
			Handler: func(_ any, s grpc.ServerStream) error {
				var hello frame
				if err := s.RecvMsg(&hello); err != nil {
					return err
				}
				if err := s.SendMsg(&frame{ClusterID: hello.ClusterID, From: hello.To, To: hello.From}); err != nil {
					return err
				}
				hellos <- struct{}{}
				for {
					if err := s.RecvMsg(&frame{}); err != nil {
						return err
					}
				}
			},
			ServerStreams: true,
			ClientStreams: true,
		}},
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	srv.RegisterService(&silent, struct{}{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	core, logs := observer.New(zapcore.WarnLevel)
	tr := New(Config{LocalID: 1, ClusterID: 1, Handler: newHandler(), Logger: zap.New(core)})
	tr.silenceTimeout = 200 * time.Millisecond
	defer tr.Stop()
	tr.AddPeer(2, []string{"http://" + lis.Addr().String()})
	for range 2 { // the first stream, then the one reopened after the silence
		select {
		case <-hellos:
		case <-time.After(wait):
			t.Fatal("no stream opened")
		}
	}
	lost := logs.FilterMessage("lost message stream to peer").All()
	if len(lost) == 0 || !strings.Contains(fmt.Sprint(lost[0].ContextMap()["error"]), "peer silent") {
		t.Fatalf("logged %v, want the stream lost to silence", lost)
	}
}

// TestKeepalivesKeepIdleStreamUp checks that an idle stream to a live peer
// survives many silence timeouts.
func TestKeepalivesKeepIdleStreamUp(t *testing.T) {
	a, b := startMember(t, 1, memberOpts{}), startMember(t, 2, memberOpts{})
	a.tr.silenceTimeout = 200 * time.Millisecond
	b.tr.keepaliveInterval = 10 * time.Millisecond
	connect(a, b)
	sendUntilReceived(t, a, b)
	since := a.tr.ActiveSince(2)
	time.Sleep(600 * time.Millisecond) // idle for three silence timeouts
	if got := a.tr.ActiveSince(2); !got.Equal(since) {
		t.Fatalf("ActiveSince changed from %v to %v: the idle stream was reopened", since, got)
	}
}

// TestStopEndsIncomingStreams checks that after Stop a member's Handler
// hears nothing more, though its gRPC server still runs, and that its peers
// see it unreachable.
func TestStopEndsIncomingStreams(t *testing.T) {
	a, b := startMember(t, 1, memberOpts{}), startMember(t, 2, memberOpts{})
	connect(a, b)
	sendUntilReceived(t, a, b)
	b.tr.Stop()
	drain(b.h)
	deadline := time.Now().Add(wait)
	for !a.tr.ActiveSince(2).IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("stream to a stopped member still active")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for len(a.h.unreachable) > 0 {
		<-a.h.unreachable
	}
	a.tr.Send([]*raftpb.Message{msg(1, 2, 1)})
	select {
	case <-a.h.unreachable:
	case <-time.After(wait):
		t.Fatal("no unreachable report for a stopped member")
	}
	if !a.tr.ActiveSince(2).IsZero() {
		t.Error("stream to a stopped member became active")
	}
	if n := len(b.h.recv); n > 0 {
		t.Fatalf("stopped member's Handler got %d messages", n)
	}
}

func TestPeerURLs(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + lis.Addr().String()
	lis.Close() // nothing listens there now

	tests := []struct {
		name   string
		add    func(b *member) []string
		update func(b *member) []string // nil: no UpdatePeer
	}{
		{name: "scheme-less host:port", add: func(b *member) []string { return []string{b.addr} }},
		{name: "a dead URL before a live one", add: func(b *member) []string { return []string{dead, b.url} }},
		{
			name:   "UpdatePeer replaces a dead URL",
			add:    func(*member) []string { return []string{dead} },
			update: func(b *member) []string { return []string{b.url} },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := startMember(t, 1, memberOpts{}), startMember(t, 2, memberOpts{})
			a.tr.AddPeer(2, tt.add(b))
			if tt.update != nil {
				a.tr.UpdatePeer(2, tt.update(b))
			}
			sendUntilReceived(t, a, b)
		})
	}
}

// BenchmarkSend measures small messages through one stream between two
// members on loopback.
func BenchmarkSend(b *testing.B) {
	lg := zap.NewNop()
	var ms []*member
	for id := uint64(1); id <= 2; id++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		h := newHandler()
		h.recv = make(chan *raftpb.Message, queueSize)
		m := &member{id: id, h: h, url: "http://" + lis.Addr().String()}
		m.tr = New(Config{LocalID: id, ClusterID: 1, Handler: h, Logger: lg})
		m.srv = grpc.NewServer()
		m.tr.Register(m.srv)
		go func() { _ = m.srv.Serve(lis) }()
		defer func() {
			m.tr.Stop()
			m.srv.Stop()
		}()
		ms = append(ms, m)
	}
	connect(ms...)
	for ms[0].tr.ActiveSince(2).IsZero() {
		time.Sleep(time.Millisecond)
	}
	done := make(chan struct{})
	go func() {
		for range b.N {
			<-ms[1].h.recv
		}
		close(done)
	}()
	b.ResetTimer()
	// Send in Ready-sized groups, pausing when the queue is nearly full so
	// that nothing is dropped and every message is counted.
	const group = 64
	for i := 0; i < b.N; i += group {
		n := min(group, b.N-i)
		msgs := make([]*raftpb.Message, n)
		for j := range msgs {
			msgs[j] = msg(1, 2, uint64(i+j))
		}
		for ms[0].tr.peer(2) != nil && len(ms[0].tr.peer(2).queue) > queueSize-2*group {
			time.Sleep(50 * time.Microsecond)
		}
		ms[0].tr.Send(msgs)
	}
	<-done
}

// stalledPeer is a fake member 2 whose message streams answer the hello
// and then never read again, as a member does while stopped by SIGSTOP or
// stuck in its Handler. With keepalives it still sends an empty frame
// every keepalive (the member's gRPC handler goroutine is alive, its
// reader is not); without, it is silent too. Its receive windows are fixed
// at 64 KiB, so a writer blocks in SendMsg after some 128 KiB.
type stalledPeer struct {
	url    string
	hellos chan struct{} // one per stream opened
}

func startStalledPeer(t *testing.T, keepalive time.Duration) *stalledPeer {
	t.Helper()
	p := &stalledPeer{hellos: make(chan struct{}, 1000)}
	desc := grpc.ServiceDesc{
		ServiceName: serviceName,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName: "Messages",
			Handler: func(_ any, s grpc.ServerStream) error {
				var hello frame
				if err := s.RecvMsg(&hello); err != nil {
					return err
				}
				if err := s.SendMsg(&frame{ClusterID: hello.ClusterID, From: hello.To, To: hello.From}); err != nil {
					return err
				}
				p.hellos <- struct{}{}
				var tick <-chan time.Time
				if keepalive > 0 {
					ticker := time.NewTicker(keepalive)
					defer ticker.Stop()
					tick = ticker.C
				}
				for {
					select {
					case <-s.Context().Done():
						return s.Context().Err()
					case <-tick:
						if err := s.SendMsg(&frame{}); err != nil {
							return err
						}
					}
				}
			},
			ServerStreams: true,
			ClientStreams: true,
		}},
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A fixed window turns off gRPC's BDP estimation, which would grow it.
	srv := grpc.NewServer(grpc.InitialWindowSize(1<<16), grpc.InitialConnWindowSize(1<<16))
	srv.RegisterService(&desc, struct{}{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	p.url = "http://" + lis.Addr().String()
	return p
}

// TestStalledPeerStreamReopened checks that a stream to a peer that stops
// reading is ended and reopened, again and again, while the writer is
// blocked sending to it: the writer must neither wait forever for flow
// control nor for a status the stream's receiving goroutine has taken.
func TestStalledPeerStreamReopened(t *testing.T) {
	tests := []struct {
		name      string
		keepalive time.Duration // 0: the peer is silent (stopped)
		wantLog   string
	}{
		{name: "frozen peer, silent", wantLog: "peer silent"},
		{name: "peer sending keepalives but not reading", keepalive: 10 * time.Millisecond, wantLog: "peer not reading"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peer := startStalledPeer(t, tt.keepalive)
			core, logs := observer.New(zapcore.WarnLevel)
			tr := New(Config{LocalID: 1, ClusterID: 1, Handler: newHandler(), Logger: zap.New(core)})
			tr.silenceTimeout = 100 * time.Millisecond
			tr.AddPeer(2, []string{peer.url})
			stop := make(chan struct{})
			sent := make(chan struct{})
			go func() { // keep the writer busy: 32 KiB messages, 1 MiB/s
				defer close(sent)
				for {
					m := msg(1, 2, 1)
					m.Entries = []*raftpb.Entry{{Data: make([]byte, 32<<10)}}
					tr.Send([]*raftpb.Message{m})
					select {
					case <-stop:
						return
					case <-time.After(30 * time.Millisecond):
					}
				}
			}()
			defer func() {
				close(stop)
				<-sent
				stopped := make(chan struct{})
				go func() { tr.Stop(); close(stopped) }()
				select {
				case <-stopped:
				case <-time.After(wait):
					t.Error("Stop hangs: a peer goroutine is stuck")
				}
			}()
			// Each stream stalls; the writer must end it and open the next.
			const streams = 4
			for i := range streams {
				select {
				case <-peer.hellos:
				case <-time.After(wait):
					t.Fatalf("stream %d never opened: the writer is stuck on the stalled stream before it (logged %v)", i+1, logs.All())
				}
			}
			lost := logs.FilterMessage("lost message stream to peer").All()
			if len(lost) == 0 || !strings.Contains(fmt.Sprint(lost[0].ContextMap()["error"]), tt.wantLog) {
				t.Fatalf("logged %v, want the stream lost with %q", lost, tt.wantLog)
			}
		})
	}
}

// endedStream is a message stream the peer has just ended while a frame
// was being sent: SendMsg says io.EOF, and the status that ended it went to
// the stream's receiving goroutine, so a RecvMsg here would wait forever,
// as gRPC's does when two goroutines receive at once.
type endedStream struct {
	grpc.ClientStream
	recvCalled chan struct{}
}

func (s *endedStream) SendMsg(any) error { return io.EOF }

func (s *endedStream) RecvMsg(any) error {
	close(s.recvCalled)
	select {} // the status was delivered to the other receiver
}

// TestWriterDoesNotReceive checks that when a send fails because the stream
// ended, the writer takes the reason from the stream's receiving goroutine
// instead of calling RecvMsg itself (which hung a leader's writer to a
// paused member for good: no reconnect, every message dropped).
func TestWriterDoesNotReceive(t *testing.T) {
	tr := New(Config{LocalID: 1, ClusterID: 1, Handler: newHandler()})
	p := newPeer(tr, 2, nil)
	defer p.stop()
	p.enqueue(msg(1, 2, 1))
	cs := &endedStream{recvCalled: make(chan struct{})}
	s := &outStream{cs: cs, cancel: func() {}, done: make(chan struct{})}
	ended := status.Error(codes.Canceled, "context canceled")
	s.err = ended
	close(s.done) // the receiving goroutine got the status
	errc := make(chan error, 1)
	go func() { errc <- p.pump(s) }()
	select {
	case err := <-errc:
		if !errors.Is(err, ended) {
			t.Fatalf("pump: %v, want the stream's status %v", err, ended)
		}
	case <-cs.recvCalled:
		t.Fatal("the writer called RecvMsg on a stream another goroutine receives on")
	case <-time.After(wait):
		t.Fatal("pump did not return after the stream ended")
	}
}

// waitSnapReport waits for the next snapshot report on h, about member 2,
// and checks its status.
func waitSnapReport(t *testing.T, h *handler, want raft.SnapshotStatus, what string) {
	t.Helper()
	select {
	case r := <-h.snaps:
		if r != (snapReport{2, want}) {
			t.Fatalf("%s: ReportSnapshot%v, want status %v", what, r, want)
		}
	case <-time.After(wait):
		t.Fatalf("%s: no ReportSnapshot within %v", what, wait)
	}
}

// waitReceive waits for the next Receive of s to return, and returns what
// it returned.
func waitReceive(t *testing.T, s *snapshotter, what string) error {
	t.Helper()
	select {
	case err := <-s.returned:
		return err
	case <-time.After(wait):
		t.Fatalf("%s: Receive did not return within %v", what, wait)
		return nil
	}
}

// closeOnCleanup closes c at the end of the test unless the test did.
// Registered after the members, it runs before they are stopped.
func closeOnCleanup(t *testing.T, c chan struct{}) {
	t.Cleanup(func() {
		select {
		case <-c:
		default:
			close(c)
		}
	})
}

// freezingSnapshotter receives like snapshotter, except that its first
// Receive stops reading until thaw is closed, as a member does while it is
// stopped by SIGSTOP: the stream's flow-control window fills and stays full.
type freezingSnapshotter struct {
	*snapshotter
	frozen chan struct{} // closed when the first Receive stops reading
	thaw   chan struct{}
	calls  atomic.Int32
}

func (s *freezingSnapshotter) Receive(m *raftpb.Message, r io.Reader) error {
	if s.calls.Add(1) == 1 {
		close(s.frozen)
		<-s.thaw
	}
	return s.snapshotter.Receive(m, r)
}

// TestSnapshotToFrozenPeer checks that a snapshot sender whose receiver
// stops reading gives up after its stall timeout and reports the failure
// (before, it waited until TCP gave up, some 15 minutes, holding the
// snapshot's data and the peer's only snapshot slot), and that the next
// snapshot to that peer then goes through.
func TestSnapshotToFrozenPeer(t *testing.T) {
	data := make([]byte, 6<<20) // several chunks, more than the receiver's windows take
	for i := range data {
		data[i] = byte(i * 7)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	recv := &freezingSnapshotter{
		snapshotter: &snapshotter{returned: make(chan error, 2)},
		frozen:      make(chan struct{}),
		thaw:        make(chan struct{}),
	}
	a := startMember(t, 1, memberOpts{snap: &snapshotter{data: data}, silence: time.Second, logger: zap.New(core)})
	// Fixed 1 MiB windows: the frozen receiver's gRPC server takes about a
	// chunk, and the sender blocks on the third. With gRPC's BDP estimation
	// the windows would grow while the data comes in, up to 16 MiB.
	b := startMember(t, 2, memberOpts{snap: recv, keepalive: 100 * time.Millisecond,
		serverOpts: []grpc.ServerOption{grpc.InitialWindowSize(1 << 20), grpc.InitialConnWindowSize(1 << 20)}})
	closeOnCleanup(t, recv.thaw)
	a.tr.AddPeer(2, []string{b.url})

	a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 42)})
	select {
	case <-recv.frozen:
	case <-time.After(wait):
		t.Fatal("the snapshot never reached the receiver")
	}
	waitSnapReport(t, a.h, raft.SnapshotFailure, "snapshot to a frozen peer")
	failed := logs.FilterMessage("failed to send snapshot").All()
	if len(failed) != 1 || !strings.Contains(fmt.Sprint(failed[0].ContextMap()["error"]), "peer not reading") {
		t.Fatalf("logged %v, want the snapshot failed for a peer not reading", failed)
	}

	// The peer resumes: the stream it was reading is over.
	close(recv.thaw)
	if err := waitReceive(t, recv.snapshotter, "thawed receiver"); err == nil {
		t.Fatal("Receive of the abandoned transfer succeeded")
	}
	a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 43)})
	waitSnapReport(t, a.h, raft.SnapshotFinish, "next snapshot")
	if err := waitReceive(t, recv.snapshotter, "next snapshot"); err != nil {
		t.Fatalf("Receive of the next snapshot: %v", err)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if _, ok := recv.received[42]; ok {
		t.Error("the abandoned transfer was stored")
	}
	if sum, ok := recv.received[43]; !ok || sum != sha256.Sum256(data) {
		t.Error("the next snapshot's data differs from what was sent")
	}
}

// waitReader blocks until its channel is closed, then says io.EOF.
type waitReader chan struct{}

func (w waitReader) Read([]byte) (int, error) {
	<-w
	return 0, io.EOF
}

// stallingSource sends like snapshotter, except that its data stops after
// what it holds until release is closed, as a leader's transfer does while
// the leader is stopped by SIGSTOP or cut off.
type stallingSource struct {
	*snapshotter
	release chan struct{}
}

func (s *stallingSource) Open(m *raftpb.Message) (io.ReadCloser, error) {
	rc, err := s.snapshotter.Open(m)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(rc, waitReader(s.release)), rc}, nil
}

// TestSnapshotFromStalledSender checks that a snapshot receiver gives up on
// a stream that stops delivering chunks after its stall timeout: Receive
// sees an error (and so releases what it staged) and nothing is stepped,
// instead of waiting for a frozen leader for as long as it stays frozen.
// The sender, once its data moves again, finds the stream over.
func TestSnapshotFromStalledSender(t *testing.T) {
	data := make([]byte, 3<<19) // one whole chunk is sent, then half of one waits
	send := &stallingSource{snapshotter: &snapshotter{data: data}, release: make(chan struct{})}
	recv := &snapshotter{returned: make(chan error, 1)}
	a := startMember(t, 1, memberOpts{snap: send})
	b := startMember(t, 2, memberOpts{snap: recv, silence: 100 * time.Millisecond})
	closeOnCleanup(t, send.release)
	a.tr.AddPeer(2, []string{b.url})

	a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 42)})
	err := waitReceive(t, recv, "receiver of a stalled stream")
	if err == nil || !strings.Contains(err.Error(), "stalled") {
		t.Fatalf("Receive returned %v, want an error for the stalled stream", err)
	}
	recv.mu.Lock()
	_, stored := recv.received[42]
	recv.mu.Unlock()
	if stored {
		t.Fatal("a stalled transfer was stored")
	}
	for len(b.h.recv) > 0 {
		if m := <-b.h.recv; m.GetType() == raftpb.MessageType_MsgSnap {
			t.Fatalf("Process got %v after a stalled transfer", m)
		}
	}

	close(send.release)
	waitSnapReport(t, a.h, raft.SnapshotFailure, "sender of the stalled stream, resumed")
}

// slowReceiver receives like snapshotter, but pauses after each MiB read,
// as a busy disk does: the transfer is slow but never stalls.
type slowReceiver struct {
	*snapshotter
	pause time.Duration
}

func (s *slowReceiver) Receive(m *raftpb.Message, r io.Reader) error {
	return s.snapshotter.Receive(m, &pausingReader{r: r, pause: s.pause})
}

type pausingReader struct {
	r     io.Reader
	pause time.Duration
	n     int // bytes read since the last pause
}

func (p *pausingReader) Read(b []byte) (int, error) {
	if p.n >= 1<<20 {
		time.Sleep(p.pause)
		p.n = 0
	}
	n, err := p.r.Read(b)
	p.n += n
	return n, err
}

// TestSlowSnapshotNotStalled checks that the stall timeout bounds the wait
// for each chunk, not the whole transfer: a snapshot that takes longer than
// the timeout, but whose chunks keep moving, goes through.
func TestSlowSnapshotNotStalled(t *testing.T) {
	// Generous, as the next transfer in TestSnapshotToFrozenPeer: a loaded
	// machine running the race detector can take a few hundred
	// milliseconds over a chunk.
	const stall = time.Second
	data := make([]byte, 6<<20) // 5 pauses: longer than one stall timeout
	recv := &slowReceiver{snapshotter: &snapshotter{returned: make(chan error, 1)}, pause: stall / 4}
	a := startMember(t, 1, memberOpts{snap: &snapshotter{data: data}, silence: stall})
	b := startMember(t, 2, memberOpts{snap: recv, silence: stall, keepalive: 100 * time.Millisecond})
	a.tr.AddPeer(2, []string{b.url})
	start := time.Now()
	a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 42)})
	waitSnapReport(t, a.h, raft.SnapshotFinish, "slow snapshot")
	if took := time.Since(start); took <= stall {
		t.Fatalf("the transfer took %v, not longer than the stall timeout %v: the test shows nothing", took, stall)
	}
	if err := waitReceive(t, recv.snapshotter, "slow snapshot"); err != nil {
		t.Fatalf("Receive: %v", err)
	}
}

// closeCountingSource sends like snapshotter and counts the Close calls on
// the data it opened, closing closed at the first.
type closeCountingSource struct {
	*snapshotter
	closes atomic.Int32
	closed chan struct{}
}

func (s *closeCountingSource) Open(m *raftpb.Message) (io.ReadCloser, error) {
	rc, err := s.snapshotter.Open(m)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{rc, closerFunc(func() error {
		if s.closes.Add(1) == 1 {
			close(s.closed)
		}
		return rc.Close()
	})}, nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// answerAfterClose receives like snapshotter, but once it has read the
// whole stream it answers only after the sender closed its data (or fails
// after half of wait, so that the sender's report comes within wait).
type answerAfterClose struct {
	*snapshotter
	senderClosed chan struct{}
}

func (s *answerAfterClose) Receive(m *raftpb.Message, r io.Reader) error {
	if err := s.snapshotter.Receive(m, r); err != nil {
		return err
	}
	select {
	case <-s.senderClosed:
		return nil
	case <-time.After(wait / 2):
		return errors.New("the sender still holds the snapshot's data after sending all of it")
	}
}

// TestSnapshotDataClosedBeforeAnswer checks that the sender closes the
// snapshot's data (an engine view, compacted batch files) once it has read
// it to the end, not only after the receiver's answer, which a receiver
// frozen or slow to store the data may keep waiting; and that it closes it
// once.
func TestSnapshotDataClosedBeforeAnswer(t *testing.T) {
	send := &closeCountingSource{snapshotter: &snapshotter{data: make([]byte, 3<<20)}, closed: make(chan struct{})}
	recv := &answerAfterClose{snapshotter: &snapshotter{returned: make(chan error, 1)}, senderClosed: send.closed}
	a := startMember(t, 1, memberOpts{snap: send})
	b := startMember(t, 2, memberOpts{snap: recv})
	a.tr.AddPeer(2, []string{b.url})
	a.tr.Send([]*raftpb.Message{snapMsg(1, 2, 42)})
	waitSnapReport(t, a.h, raft.SnapshotFinish, "snapshot")
	if n := send.closes.Load(); n != 1 {
		t.Fatalf("the data was closed %d times, want once", n)
	}
}

// TestSetPeers: the peers follow the member list: this member is never its
// own peer, a new member is added with its URLs, a known one gets its new
// URLs, and one no longer listed is removed.
func TestSetPeers(t *testing.T) {
	tr := New(Config{LocalID: 1, ClusterID: 1, Handler: newHandler()})
	defer tr.Stop()
	peers := func() map[uint64][]string {
		out := map[uint64][]string{}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for id, p := range tr.mu.peers {
			p.mu.Lock()
			out[id] = append([]string(nil), p.mu.urls...)
			p.mu.Unlock()
		}
		return out
	}
	for _, step := range []struct {
		members []*pb.Member
		want    map[uint64][]string
	}{
		{members: []*pb.Member{{ID: 1, PeerURLs: []string{"http://127.0.0.1:1"}}, {ID: 2, PeerURLs: []string{"http://127.0.0.1:2"}},
			{ID: 3, PeerURLs: []string{"http://127.0.0.1:3"}}},
			want: map[uint64][]string{2: {"http://127.0.0.1:2"}, 3: {"http://127.0.0.1:3"}}},
		{members: []*pb.Member{{ID: 1}, {ID: 3, PeerURLs: []string{"http://127.0.0.1:4"}}},
			want: map[uint64][]string{3: {"http://127.0.0.1:4"}}},
		{members: nil, want: map[uint64][]string{}},
	} {
		tr.SetPeers(step.members)
		if got := peers(); !reflect.DeepEqual(got, step.want) {
			t.Fatalf("after SetPeers(%v): peers %v, want %v", step.members, got, step.want)
		}
	}
}

// A member that removed a peer refuses the removed member's streams, and
// ends one it was already serving: the removed member learns its removal
// (RemovedByPeer), as etcd's peers answer a removed member with 410 Gone.
// A member only unknown to the peer (not yet applied there) is served.
func TestRemovedMemberRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		// removeFirst: the peer knows the removal before the stream opens.
		removeFirst bool
	}{{"removed before the stream opens", true}, {"removed while the stream is served", false}} {
		t.Run(tc.name, func(t *testing.T) {
			a := startMember(t, 1, memberOpts{})
			b := startMember(t, 2, memberOpts{keepalive: 10 * time.Millisecond})
			b.tr.SetRemoved([]uint64{7}) // another member's removal changes nothing for 1
			if tc.removeFirst {
				b.tr.SetRemoved([]uint64{1, 7})
			}
			a.tr.AddPeer(2, []string{b.url})
			if !tc.removeFirst {
				// Served while member 1 is unknown to member 2: its
				// messages arrive.
				deadline := time.Now().Add(wait)
				for delivered := false; !delivered; {
					a.tr.Send([]*raftpb.Message{msg(1, 2, 1)})
					select {
					case <-b.h.recv:
						delivered = true
					case <-time.After(20 * time.Millisecond):
					}
					if time.Now().After(deadline) {
						t.Fatal("member 1's message never arrived")
					}
				}
				select {
				case <-a.tr.RemovedByPeer():
					t.Fatal("member 1 told it was removed before its removal")
				default:
				}
				b.tr.SetRemoved([]uint64{1})
			}
			select {
			case <-a.tr.RemovedByPeer():
			case <-time.After(wait):
				t.Fatal("member 1 never learned its removal from member 2")
			}
		})
	}
}
