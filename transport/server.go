package transport

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The peer service, written by hand rather than generated (doc.go says why).
// Both methods are bidirectional streams of frames.
const (
	serviceName    = "strata.transport.Peer"
	messagesMethod = "/" + serviceName + "/Messages"
	snapshotMethod = "/" + serviceName + "/Snapshot"
)

// peerService is the handler type gRPC checks Register's argument against.
type peerService interface {
	serveMessages(grpc.ServerStream) error
	serveSnapshot(grpc.ServerStream) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*peerService)(nil),
	Streams: []grpc.StreamDesc{
		{
			StreamName:    "Messages",
			Handler:       func(srv any, s grpc.ServerStream) error { return srv.(peerService).serveMessages(s) },
			ServerStreams: true,
			ClientStreams: true,
		},
		{
			StreamName:    "Snapshot",
			Handler:       func(srv any, s grpc.ServerStream) error { return srv.(peerService).serveSnapshot(s) },
			ServerStreams: true,
			ClientStreams: true,
		},
	},
	Metadata: "transport/FORMAT.md",
}

// ErrClusterIDMismatch is the reason a member refuses a stream from a member
// of another cluster. It crosses the wire as the text of a
// FailedPrecondition status.
var ErrClusterIDMismatch = errors.New("cluster ID mismatch")

// ErrMemberRemoved is the reason a member refuses a stream from a member
// the cluster removed (Transport.SetRemoved). It crosses the wire as the
// text of a FailedPrecondition status.
var ErrMemberRemoved = errors.New("the member has been permanently removed from the cluster")

// removedError is the refusal of a stream from removed member id.
func removedError(id uint64) error {
	return status.Errorf(codes.FailedPrecondition, "%v: member %x", ErrMemberRemoved, id)
}

// serve runs recv, which reads the rest of s and calls the Handler, on a
// goroutine counted in t.wg, and returns when recv does, when the
// transport stops, or when stalled is closed (recv waited too long for a
// frame; nil: never). With keepalive it also sends an empty frame every
// keepaliveInterval meanwhile, so that the sender can tell a silent peer
// from an idle one, and ends the stream once from, its sender, is removed
// from the cluster.
//
// Only the calling goroutine (the gRPC handler's) sends on s, so nothing is
// sent after the handler returns. recv may outlive the handler when the
// transport stops or the stream stalls: returning from the handler is the
// only way to end a server stream, and its next (or pending) RecvMsg then
// fails. Stop waits for recv to return, so no Handler call outlives Stop.
func (t *Transport) serve(s grpc.ServerStream, from uint64, keepalive bool, stalled <-chan struct{}, recv func() error) error {
	errc := make(chan error, 1)
	if !t.goUnlessStopped(func() { errc <- recv() }) {
		return status.Error(codes.Unavailable, "peer transport stopped")
	}
	var tick <-chan time.Time
	if keepalive {
		ticker := time.NewTicker(t.keepaliveInterval)
		defer ticker.Stop()
		tick = ticker.C
	}
	for {
		select {
		case err := <-errc:
			return err
		case <-t.stopc:
			return status.Error(codes.Unavailable, "peer transport stopped")
		case <-stalled:
			return status.Errorf(codes.DeadlineExceeded, "peer stream stalled: no frame for %v", t.silenceTimeout)
		case <-tick:
			if t.isRemoved(from) {
				// Removed after the stream was accepted: end it, so
				// that the member learns it at its next handshake.
				return removedError(from)
			}
			if err := s.SendMsg(&frame{}); err != nil {
				return fmt.Errorf("send keepalive: %w", err)
			}
		}
	}
}

// checkHello checks the first frame of an incoming stream.
func (t *Transport) checkHello(f *frame) error {
	if f.ClusterID != t.cfg.ClusterID {
		return status.Errorf(codes.FailedPrecondition, "%v: member %x of cluster %x refused member %x of cluster %x",
			ErrClusterIDMismatch, t.cfg.LocalID, t.cfg.ClusterID, f.From, f.ClusterID)
	}
	if f.To != t.cfg.LocalID {
		return status.Errorf(codes.FailedPrecondition, "member %x received a stream from member %x meant for member %x",
			t.cfg.LocalID, f.From, f.To)
	}
	if f.From == 0 {
		return status.Error(codes.InvalidArgument, "peer stream hello without a sender ID")
	}
	if t.isRemoved(f.From) {
		return removedError(f.From)
	}
	return nil
}

// readHello reads the first frame of an incoming stream.
func readHello(s grpc.ServerStream, what string) (*frame, error) {
	var hello frame
	if err := s.RecvMsg(&hello); err != nil {
		return nil, fmt.Errorf("receive %s hello: %w", what, err)
	}
	return &hello, nil
}

// acceptHello checks the hello of an incoming stream, logging a refusal:
// the refused side logs it too, but an operator may look here.
func (t *Transport) acceptHello(hello *frame, what string) (*frame, error) {
	if err := t.checkHello(hello); err != nil {
		t.lg.Warn("refused peer stream", zap.String("stream", what), zap.Error(err))
		return nil, err
	}
	select {
	case <-t.stopc:
		// Refuse before answering, so that the sender does not count the
		// stream as healthy for a moment.
		return nil, status.Error(codes.Unavailable, "peer transport stopped")
	default:
	}
	return hello, nil
}

// serveMessages serves one peer's message stream: check the hello, answer
// it, then hand every message of every batch to the Handler, in order.
func (t *Transport) serveMessages(s grpc.ServerStream) error {
	hello, err := readHello(s, "messages")
	if err != nil {
		return err
	}
	return t.serveMessagesAfter(s, hello)
}

// serveMessagesAfter serves a message stream whose hello was read.
func (t *Transport) serveMessagesAfter(s grpc.ServerStream, hello *frame) error {
	hello, err := t.acceptHello(hello, "messages")
	if err != nil {
		return err
	}
	if err := s.SendMsg(&frame{ClusterID: t.cfg.ClusterID, From: t.cfg.LocalID, To: hello.From}); err != nil {
		return fmt.Errorf("answer hello of member %x: %w", hello.From, err)
	}
	return t.serve(s, hello.From, true, nil, func() error {
		ctx := s.Context()
		for {
			var f frame
			if err := s.RecvMsg(&f); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return fmt.Errorf("receive from member %x: %w", hello.From, err)
			}
			for _, m := range f.Msgs {
				if m.GetFrom() != hello.From || m.GetTo() != t.cfg.LocalID {
					// A peer speaks only for itself, to this member: a
					// message naming another sender or receiver would
					// reach raft as if that member had sent it.
					return status.Errorf(codes.InvalidArgument, "%s from member %x to %x on member %x's stream to %x",
						m.GetType(), m.GetFrom(), m.GetTo(), hello.From, t.cfg.LocalID)
				}
				if err := t.cfg.Handler.Process(ctx, m); err != nil {
					// The node is stopping or the stream's context ended:
					// ending the stream tells the sender to retry later.
					return status.Errorf(codes.Unavailable, "process %s from member %x: %v", m.GetType(), hello.From, err)
				}
			}
		}
	})
}

// serveSnapshot receives one snapshot: the hello frame carries the MsgSnap,
// the next frames the data, which Snapshotter.Receive consumes; then the
// MsgSnap goes to the Handler and an empty frame tells the sender it is done.
func (t *Transport) serveSnapshot(s grpc.ServerStream) error {
	hello, err := readHello(s, "snapshot")
	if err != nil {
		return err
	}
	return t.serveSnapshotAfter(s, hello)
}

// serveSnapshotAfter serves a snapshot stream whose hello was read.
func (t *Transport) serveSnapshotAfter(s grpc.ServerStream, hello *frame) error {
	hello, err := t.acceptHello(hello, "snapshot")
	if err != nil {
		return err
	}
	if len(hello.Msgs) != 1 || hello.Msgs[0].GetType() != raftpb.MessageType_MsgSnap {
		return status.Errorf(codes.InvalidArgument, "snapshot stream from member %x does not start with one MsgSnap", hello.From)
	}
	m := hello.Msgs[0]
	index := m.GetSnapshot().GetMetadata().GetIndex()
	if t.cfg.Snapshotter == nil {
		return status.Errorf(codes.Unimplemented, "member %x cannot receive snapshots", t.cfg.LocalID)
	}
	lg := t.lg.With(zap.String("peer-id", fmt.Sprintf("%x", hello.From)), zap.Uint64("index", index))
	r := newChunkReader(s, t.silenceTimeout)
	err = t.serve(s, hello.From, false, r.stalledc, func() error {
		defer r.stall.Stop()
		if err := t.cfg.Snapshotter.Receive(m, r); err != nil {
			lg.Warn("failed to receive snapshot", zap.Error(err))
			return status.Errorf(codes.Aborted, "member %x: receive snapshot at index %d: %v", t.cfg.LocalID, index, err)
		}
		// Receive may stop reading before the last chunk (say, at the end of
		// its own framing); the transfer still counts only if the sender
		// finished it.
		if _, err := io.Copy(io.Discard, r); err != nil {
			return status.Errorf(codes.Aborted, "member %x: snapshot stream at index %d: %v", t.cfg.LocalID, index, err)
		}
		lg.Info("received snapshot", zap.Int64("bytes", r.n))
		if err := t.cfg.Handler.Process(s.Context(), m); err != nil {
			return status.Errorf(codes.Unavailable, "process snapshot from member %x: %v", hello.From, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return s.SendMsg(&frame{})
}

// chunkReader reads the snapshot data of a stream: the Chunk of each frame
// until the frame marked Last.
//
// A sender that stops sending (frozen by SIGSTOP, partitioned) would keep
// Read waiting, and Snapshotter.Receive with it, holding what it staged,
// for as long as that lasts: TCP notices nothing while no data is
// outstanding. So a receive that waits longer than timeout for a frame
// closes stalledc, on which serve ends the stream; the receive then fails.
// Only time spent waiting for the sender counts, not time Receive takes
// between reads (a slow disk is not a stalled sender).
type chunkReader struct {
	s       grpc.ServerStream
	timeout time.Duration
	stall   *time.Timer // armed while a receive waits
	// stalled is set, and stalledc closed, when a receive waited timeout.
	stalled  atomic.Bool
	stalledc chan struct{}

	buf  []byte
	done bool
	n    int64 // bytes read
}

func newChunkReader(s grpc.ServerStream, timeout time.Duration) *chunkReader {
	r := &chunkReader{s: s, timeout: timeout, stalledc: make(chan struct{})}
	r.stall = time.AfterFunc(timeout, func() {
		if r.stalled.CompareAndSwap(false, true) {
			close(r.stalledc)
		}
	})
	r.stall.Stop()
	return r
}

// Read implements io.Reader. It returns io.EOF after the last chunk and
// io.ErrUnexpectedEOF if the stream ends before it.
func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.done {
			return 0, io.EOF
		}
		var f frame
		r.stall.Reset(r.timeout)
		err := r.s.RecvMsg(&f)
		r.stall.Stop()
		if r.stalled.Load() {
			if err == nil { // received just as the timer fired; the stream is ending
				err = status.Error(codes.DeadlineExceeded, "peer stream stalled")
			}
			return 0, fmt.Errorf("snapshot stream stalled: no chunk for %v after %d bytes: %w", r.timeout, r.n, err)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return 0, fmt.Errorf("snapshot stream ended after %d bytes without its last chunk: %w", r.n, io.ErrUnexpectedEOF)
			}
			return 0, fmt.Errorf("receive snapshot chunk after %d bytes: %w", r.n, err)
		}
		r.buf, r.done = f.Chunk, f.Last
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	r.n += int64(n)
	return n, nil
}
