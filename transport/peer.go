package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// peer sends to one remote member.
//
// Concurrency: enqueue and sendSnapshot are called by Send, from any
// goroutine, and never block. Goroutines, counted in the Transport's wg: run
// (the stream writer, the only reader of queue), report (the only caller of
// Handler.ReportUnreachable for this peer), and one per snapshot in flight.
// All end soon after stop, which does not wait for them: RemovePeer may be
// called from the goroutine a Handler call waits for.
//
// Invariants:
//  1. At most one message stream to the peer is open, owned by run.
//  2. Messages leave the queue in Send order and are sent in that order, so
//     the peer receives a subsequence of what was sent, in order.
//  3. A message the transport drops (queue full, stream down, failed write)
//     is reported unreachable. One written to a stream that breaks before
//     the peer reads it is lost unreported, as on any network; raft
//     retransmits it.
type peer struct {
	t   *Transport
	id  uint64
	lg  *zap.Logger
	ctx context.Context // canceled by stop
	end context.CancelFunc

	queue       chan *raftpb.Message
	unreachable chan struct{} // capacity 1: pending ReportUnreachable
	snapBusy    atomic.Bool   // a snapshot is being sent

	mu struct {
		sync.Mutex
		urls   []string
		next   int       // index in urls of the next connection attempt
		active time.Time // when the current stream became healthy; zero if none
	}
}

func newPeer(t *Transport, id uint64, urls []string) *peer {
	ctx, cancel := context.WithCancel(context.Background())
	p := &peer{
		t:           t,
		id:          id,
		lg:          t.lg.With(zap.String("peer-id", fmt.Sprintf("%x", id))),
		ctx:         ctx,
		end:         cancel,
		queue:       make(chan *raftpb.Message, queueSize),
		unreachable: make(chan struct{}, 1),
	}
	p.mu.urls = append([]string(nil), urls...)
	return p
}

// startLocked starts the peer's goroutines.
//
// REQUIRES: p.t.mu held, transport not stopped.
func (p *peer) startLocked() {
	p.t.goLocked(p.run)
	p.t.goLocked(p.report)
}

// stop cancels everything in flight; the goroutines end soon after.
func (p *peer) stop() { p.end() }

func (p *peer) setURLs(urls []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.urls = append([]string(nil), urls...)
	p.mu.next = 0
}

// pickURL returns the URL for the next connection attempt, rotating through
// the peer's URLs so that one dead address does not hide a live one.
func (p *peer) pickURL() (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.mu.urls) == 0 {
		return "", fmt.Errorf("peer %x has no URLs", p.id)
	}
	u := p.mu.urls[p.mu.next%len(p.mu.urls)]
	p.mu.next++
	return u, nil
}

func (p *peer) activeSince() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.active
}

func (p *peer) setActive(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.active = t
}

// enqueue queues m for the stream, or drops it if the queue is full.
func (p *peer) enqueue(m *raftpb.Message) {
	select {
	case p.queue <- m:
	default:
		p.lg.Debug("dropped message: queue full", zap.Stringer("type", m.GetType()))
		p.markUnreachable()
	}
}

// markUnreachable asks the report goroutine to tell raft; reports pending at
// once collapse into one.
func (p *peer) markUnreachable() {
	select {
	case p.unreachable <- struct{}{}:
	default:
	}
}

// report calls Handler.ReportUnreachable for markUnreachable. It is a
// goroutine of its own so that neither Send nor the stream writer waits for
// the Handler (which may wait for the goroutine that calls Send).
func (p *peer) report() {
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.unreachable:
			p.t.cfg.Handler.ReportUnreachable(p.id)
		}
	}
}

// run keeps a message stream to the peer open and feeds it the queue.
// Between attempts it waits, with exponential backoff, dropping (and
// reporting) whatever is queued: raft learns the peer is unreachable and
// retransmits once it is back, rather than receiving stale messages. A
// stream that was up for longer than maxBackoff is reopened at once; one
// that broke sooner counts as a failed attempt, so that a peer that accepts
// and then drops streams is not redialled in a tight loop.
func (p *peer) run() {
	wait := minBackoff
	var lastErr string // logged once per distinct error, not per attempt
	for p.ctx.Err() == nil {
		s, err := p.connect()
		p.t.noteRefusal(err)
		if err == nil {
			lastErr = ""
			up := time.Now()
			p.setActive(up)
			p.lg.Info("peer stream active")
			err = p.pump(s)
			p.setActive(time.Time{})
			s.close()
			p.t.noteRefusal(s.err) // set once close has waited for the reader
			if p.ctx.Err() != nil {
				return
			}
			p.lg.Warn("lost message stream to peer", zap.Error(err))
			if time.Since(up) > maxBackoff {
				wait = minBackoff
				continue
			}
		} else if msg := err.Error(); msg != lastErr {
			p.lg.Warn("cannot open message stream to peer", zap.Error(err))
			lastErr = msg
		}
		p.dropFor(wait)
		wait = min(2*wait, maxBackoff)
	}
}

// dropFor waits d (or until stop), dropping queued messages.
func (p *peer) dropFor(d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-timer.C:
			return
		case <-p.queue:
			p.markUnreachable()
		}
	}
}

// outStream is an open message stream to the peer.
//
// Concurrency: only the goroutine connect starts calls cs.RecvMsg; only
// the writer (pump) calls cs.SendMsg. gRPC allows one of each at a time,
// and no more: the status that ends a stream is delivered to one RecvMsg,
// so a second one waiting at the same moment waits forever.
type outStream struct {
	conn   *grpc.ClientConn
	cs     grpc.ClientStream
	cancel context.CancelFunc
	done   chan struct{} // closed when the stream ends; err is then set
	err    error

	// stalled is set when a send did not finish within the write timeout
	// (the peer stopped reading) and the stream was canceled for it.
	stalled atomic.Bool
}

func (s *outStream) close() {
	s.cancel()
	<-s.done
	_ = s.conn.Close() // the stream is over; a close error changes nothing
}

// openStream dials the peer's next URL and opens a stream of desc that
// lives as long as ctx, sending hello first. The caller closes conn.
func (p *peer) openStream(ctx context.Context, desc *grpc.StreamDesc, method string, hello *frame) (*grpc.ClientConn, grpc.ClientStream, error) {
	u, err := p.pickURL()
	if err != nil {
		return nil, nil, err
	}
	conn, err := p.t.dial(u)
	if err != nil {
		return nil, nil, err
	}
	cs, err := conn.NewStream(ctx, desc, method)
	if err == nil {
		err = sendMsg(cs, hello)
	}
	if err != nil {
		_ = conn.Close() // the attempt failed; the conn has nothing else
		return nil, nil, fmt.Errorf("open %s to %s: %w", method, u, err)
	}
	return conn, cs, nil
}

// connect opens a message stream and waits for the peer's answer to the
// hello, at most DialTimeout.
func (p *peer) connect() (*outStream, error) {
	t := p.t
	hello := &frame{ClusterID: t.cfg.ClusterID, From: t.cfg.LocalID, To: p.id}
	ctx, cancel := context.WithCancel(p.ctx)
	timer := time.AfterFunc(t.cfg.DialTimeout, cancel)
	conn, cs, err := p.openStream(ctx, &serviceDesc.Streams[0], messagesMethod, hello)
	if err != nil {
		timer.Stop()
		cancel()
		return nil, fmt.Errorf("handshake with peer %x: %w", p.id, err)
	}
	var ack frame
	err = cs.RecvMsg(&ack)
	if !timer.Stop() {
		err = fmt.Errorf("peer did not answer within %v", t.cfg.DialTimeout)
	} else if err == nil && ack.ClusterID != t.cfg.ClusterID {
		err = fmt.Errorf("%w: peer %x answered for cluster %x, local cluster is %x", ErrClusterIDMismatch, p.id, ack.ClusterID, t.cfg.ClusterID)
	} else if err == nil && ack.From != p.id {
		err = fmt.Errorf("member %x answered at the URL of peer %x", ack.From, p.id)
	}
	if err != nil {
		cancel()
		_ = conn.Close()
		return nil, fmt.Errorf("handshake with peer %x: %w", p.id, err)
	}
	s := &outStream{conn: conn, cs: cs, cancel: cancel, done: make(chan struct{})}
	// The peer sends an empty frame every keepaliveInterval; one that stays
	// silent for silenceTimeout is gone (a partition, a hung machine) even
	// if TCP has not noticed. A receive also returns when the stream ends,
	// which is how the writer learns of it, idle or not (pump). This is the
	// stream's only receiver.
	go func() {
		var silent atomic.Bool
		timer := time.AfterFunc(t.silenceTimeout, func() {
			silent.Store(true)
			cancel()
		})
		defer timer.Stop()
		var err error
		for err == nil {
			err = cs.RecvMsg(&frame{})
			timer.Reset(t.silenceTimeout)
		}
		if silent.Load() {
			err = fmt.Errorf("peer silent for %v: %w", t.silenceTimeout, err)
		}
		s.err = err
		close(s.done)
	}()
	return s, nil
}

// pump sends queued messages on s until it fails or the peer stops. Each
// frame carries everything queued when the stream is ready (up to
// maxBatchBytes): under load, messages that queue while a frame is being
// written all go in the next one.
//
// A send blocks while the peer's flow-control window is full, which it
// stays when the peer stopped reading: a member frozen (SIGSTOP, a long
// pause) or whose reader is stuck, even if its keepalives still come. A
// send that has not finished after silenceTimeout (the write timeout)
// cancels the stream, as silence does on the receiving side, and the
// writer reconnects.
func (p *peer) pump(s *outStream) error {
	timeout := p.t.silenceTimeout
	stall := time.AfterFunc(timeout, func() {
		s.stalled.Store(true)
		s.cancel()
	})
	stall.Stop()
	defer stall.Stop()
	batch := make([]*raftpb.Message, 0, 64)
	for {
		select {
		case <-p.ctx.Done():
			return p.ctx.Err()
		case <-s.done:
			return s.err
		case m := <-p.queue:
			batch = append(batch[:0], m)
			size := proto.Size(m)
		fill:
			for size < maxBatchBytes {
				select {
				case m := <-p.queue:
					batch = append(batch, m)
					size += proto.Size(m)
				default:
					break fill
				}
			}
			stall.Reset(timeout)
			err := s.cs.SendMsg(&frame{Msgs: batch})
			stall.Stop()
			if err != nil {
				// The batch is lost; raft retransmits.
				p.markUnreachable()
				return p.sendFailed(s, err)
			}
		}
	}
}

// sendFailed returns why a send on s failed. SendMsg says only io.EOF once
// the stream is over; the reason is the status the stream's receiving
// goroutine gets, which it does at once for a stream that is over. The
// writer must not ask RecvMsg itself: that goroutine may be waiting in
// RecvMsg too, and gRPC delivers the status to one of them only, leaving
// the other waiting forever (the writer, which then never reconnected,
// or the receiver, which close then waited for forever).
func (p *peer) sendFailed(s *outStream, err error) error {
	if errors.Is(err, io.EOF) {
		select {
		case <-s.done:
			err = s.err
		case <-p.ctx.Done():
			return p.ctx.Err()
		}
	}
	if s.stalled.Load() {
		err = fmt.Errorf("peer not reading: a send blocked for %v: %w", p.t.silenceTimeout, err)
	}
	return err
}

// sendMsg sends f on cs. When the peer has ended the stream, SendMsg says
// only io.EOF; the reason comes from RecvMsg, which sendMsg therefore
// calls: only for streams no other goroutine receives on (a hello before
// the receiving goroutine starts, a snapshot stream).
func sendMsg(cs grpc.ClientStream, f *frame) error {
	err := cs.SendMsg(f)
	if errors.Is(err, io.EOF) {
		if rerr := cs.RecvMsg(&frame{}); rerr != nil && !errors.Is(rerr, io.EOF) {
			return rerr
		}
	}
	return err
}

// sendSnapshot sends m and its data on a goroutine of its own and reports
// the outcome. One snapshot at a time per peer: raft sends the next only
// after the report of the last, so one that arrives while another is in
// flight is refused (reported failed) rather than doubling the load.
func (p *peer) sendSnapshot(m *raftpb.Message) {
	p.t.goUnlessStopped(func() {
		if !p.snapBusy.CompareAndSwap(false, true) {
			p.lg.Warn("refused snapshot: another is being sent", zap.Uint64("index", m.GetSnapshot().GetMetadata().GetIndex()))
			p.t.cfg.Handler.ReportSnapshot(p.id, raft.SnapshotFailure)
			return
		}
		index := m.GetSnapshot().GetMetadata().GetIndex()
		start := time.Now()
		n, err := p.streamSnapshot(m)
		// Free the slot before reporting: the report may make raft send
		// the next snapshot at once.
		p.snapBusy.Store(false)
		if err != nil {
			p.lg.Warn("failed to send snapshot", zap.Uint64("index", index), zap.Int64("bytes", n), zap.Error(err))
			p.t.cfg.Handler.ReportSnapshot(p.id, raft.SnapshotFailure)
			return
		}
		p.lg.Info("sent snapshot", zap.Uint64("index", index), zap.Int64("bytes", n), zap.Duration("took", time.Since(start)))
		p.t.cfg.Handler.ReportSnapshot(p.id, raft.SnapshotFinish)
	})
}

// streamSnapshot sends m, then the bytes Snapshotter.Open gives in chunks,
// then the last-chunk mark, and waits for the receiver's answer. It returns
// the number of data bytes sent.
//
// A send blocks while the receiver's flow-control window is full, which it
// stays when the receiver stopped reading (frozen by SIGSTOP, partitioned,
// stuck): TCP alone gives up after some 15 minutes, or never while a
// stopped process's kernel still answers, and all that time the data (an
// engine view, compacted batch files) stays open and the peer's only
// snapshot slot taken. So, as on message streams, a frame not sent within
// silenceTimeout (the stall timeout) cancels the stream and the transfer
// fails. The timeout bounds each frame, not the transfer: a snapshot may
// take as long as it needs while its chunks keep moving. The wait for the
// answer is not bounded (the receiver sends nothing while it stores the
// data), but the data is closed before it.
func (p *peer) streamSnapshot(m *raftpb.Message) (int64, error) {
	t := p.t
	if t.cfg.Snapshotter == nil {
		return 0, errors.New("no Snapshotter configured")
	}
	rc, err := t.cfg.Snapshotter.Open(m)
	if err != nil {
		return 0, fmt.Errorf("open snapshot data: %w", err)
	}
	// The data is closed as soon as it is read to its end: the receiver's
	// answer may be long in coming (it stores the data first, and may be
	// frozen meanwhile), and the data holds an engine view or compacted
	// batch files open.
	closeData := func() {
		if rc != nil {
			_ = rc.Close() // everything was read, or the transfer failed anyway
			rc = nil
		}
	}
	defer closeData()
	hello := &frame{ClusterID: t.cfg.ClusterID, From: t.cfg.LocalID, To: p.id, Msgs: []*raftpb.Message{m}}
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	conn, cs, err := p.openStream(ctx, &serviceDesc.Streams[1], snapshotMethod, hello)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	timeout := t.silenceTimeout
	var stalled atomic.Bool
	stall := time.AfterFunc(timeout, func() {
		stalled.Store(true)
		cancel()
	})
	stall.Stop()
	defer stall.Stop()
	// send sends f within timeout or cancels the stream. This goroutine is
	// the stream's only receiver, so sendMsg may ask RecvMsg why it ended.
	send := func(f *frame) error {
		stall.Reset(timeout)
		err := sendMsg(cs, f)
		stall.Stop()
		if stalled.Load() {
			if err == nil { // sent just as the timer fired
				err = ctx.Err()
			}
			return fmt.Errorf("peer not reading: a frame not sent within %v: %w", timeout, err)
		}
		return err
	}
	var n int64
	buf := make([]byte, chunkSize)
	for {
		k, rerr := fill(rc, buf)
		if k > 0 {
			if err := send(&frame{Chunk: buf[:k]}); err != nil {
				return n, fmt.Errorf("send snapshot chunk at byte %d: %w", n, err)
			}
			n += int64(k)
		}
		if rerr == io.EOF { // io.Reader's contract: EOF itself, never wrapped
			closeData()
			break
		}
		if rerr != nil {
			return n, fmt.Errorf("read snapshot data at byte %d: %w", n, rerr)
		}
	}
	if err := send(&frame{Last: true}); err != nil {
		return n, fmt.Errorf("send last snapshot chunk: %w", err)
	}
	if err := cs.CloseSend(); err != nil {
		return n, fmt.Errorf("close snapshot stream: %w", err)
	}
	if err := cs.RecvMsg(&frame{}); err != nil {
		return n, fmt.Errorf("snapshot not accepted: %w", err)
	}
	return n, nil
}

// fill reads into buf until it is full or r fails; unlike io.ReadFull it
// passes io.EOF through, so a short last chunk is not mistaken for a
// truncated one (and a reader's own io.ErrUnexpectedEOF stays an error).
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := r.Read(buf[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
