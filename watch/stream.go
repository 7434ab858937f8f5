package watch

import (
	"context"
	"slices"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// Request creates a watch, in the hub's terms: the server has already
// turned etcd's wire conventions into these (an empty key is "\x00", an
// empty range_end means one key, "\x00" means every key from Key on).
type Request struct {
	Key []byte
	// End is nil for Key alone, empty for every key >= Key, else the
	// exclusive end of the range.
	End []byte
	// StartRev is the first revision to report; 0 means the next one,
	// and a negative one is refused (ErrNegativeStart), as etcd refuses it.
	StartRev int64
	// WatchID is the client's choice; 0 asks the stream for one (etcd's
	// AutoWatchID; automatic IDs start at 0 too).
	WatchID        int64
	PrevKV         bool
	ProgressNotify bool
	Fragment       bool
	NoPut          bool
	NoDelete       bool
}

// Stream is one client's watch stream: its watchers and the queue of
// responses for it, in the order the client must see them.
//
// Concurrency: Watch, Cancel and RequestProgress from one goroutine (the
// gRPC receive loop), Next from another (the send loop); Close from any.
// watchers and nextID are guarded by Hub.mu; the queue by qmu.
type Stream struct {
	h *Hub

	watchers map[int64]*watcher // guarded by Hub.mu
	nextID   int64              // guarded by Hub.mu

	ready chan struct{} // capacity 1: the queue became non-empty or closed
	room  chan struct{} // capacity 1: the queue shrank

	qmu    sync.Mutex
	queue  []item
	events int  // queued items that may be dropped (event or periodic progress)
	bytes  int  // keys and values in those items
	full   bool // a push was refused since the queue last shrank
	closed bool
	// maxRev is the highest header revision of the responses queued so
	// far, sent or not: no progress notification may carry less
	// (invariant 5). A created or canceled response carries the store's
	// revision, which may be ahead of the hub's.
	maxRev int64
}

// item is one queued response. w is the watcher it belongs to if the
// response is droppable when w is canceled before it is sent.
type item struct {
	resp  *pb.WatchResponse
	w     *watcher
	force bool // a control response: queued even when the queue is full
	size  int  // keys and values it carries, set by push
}

// payload counts the keys and values of resp's events, the part of a
// response that can be large.
func payload(resp *pb.WatchResponse) int {
	n := 0
	for _, ev := range resp.Events {
		n += len(ev.Kv.GetKey()) + len(ev.Kv.GetValue())
		if ev.PrevKv != nil {
			n += len(ev.PrevKv.Key) + len(ev.PrevKv.Value)
		}
	}
	return n
}

// Response is what Next returns: a response and whether its watcher asked
// for fragmentation of large responses.
type Response struct {
	*pb.WatchResponse
	Fragment bool
}

// NewStream opens a stream. Close it when the client goes away.
func (h *Hub) NewStream() *Stream {
	s := &Stream{h: h, watchers: map[int64]*watcher{}, ready: make(chan struct{}, 1), room: make(chan struct{}, 1)}
	h.mu.Lock()
	if h.mu.closed {
		s.closed = true
	} else {
		h.mu.streams[s] = struct{}{}
	}
	h.mu.Unlock()
	return s
}

// Watch creates a watch and queues its created response (on failure, a
// created-and-canceled one with etcd's reason and watch ID -1, as etcd
// answers). It returns the watch ID or the error.
func (s *Stream) Watch(r Request) (int64, error) {
	h := s.h
	h.mu.Lock()
	defer h.mu.Unlock()
	storeRev := h.src.Rev()
	fail := func(err error) (int64, error) {
		s.push(item{resp: &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: storeRev}, WatchId: -1,
			Created: true, Canceled: true, CancelReason: err.Error()}, force: true})
		return -1, err
	}
	if _, open := h.mu.streams[s]; !open {
		// The stream closed (or the hub did): a watcher added now would
		// never be removed.
		return -1, ErrClosed
	}
	// Only 0 means "from the next revision"; a negative start neither
	// starts from now nor replays history. etcd's gRPC layer
	// (server/etcdserver/api/v3rpc/watch.go, recvLoop, since v3.5.24,
	// v3.6.6 and v3.7.0) refuses it before the range and ID checks (and
	// before its permission check, which strata's server makes earlier,
	// in server/auth.go): a created-and-canceled response with watch ID
	// -1, the store's revision in the header, no compact_revision, and
	// ErrCompacted's text, whether or not anything was compacted. Older
	// etcd passed it to its store (server/storage/mvcc/watchable_store.go),
	// where the outcome depended on the compact revision; no client can
	// rely on that.
	if r.StartRev < 0 {
		return fail(ErrNegativeStart)
	}
	if err := validRange(r.Key, r.End); err != nil {
		return fail(err)
	}
	id := r.WatchID
	if id == 0 {
		for s.watchers[s.nextID] != nil {
			s.nextID++
		}
		id = s.nextID
		s.nextID++
	} else if s.watchers[id] != nil {
		return fail(ErrDuplicateID)
	}
	start := r.StartRev
	if start == 0 {
		start = storeRev + 1
	}
	w := &watcher{
		s: s, id: id, key: slices.Clone(r.Key), end: r.End, prevKV: r.PrevKV, progress: r.ProgressNotify,
		fragment: r.Fragment, noPut: r.NoPut, noDelete: r.NoDelete, startRev: r.StartRev, nextRev: start,
	}
	if r.End != nil {
		w.end = append([]byte{}, r.End...)
	}
	s.watchers[id] = w
	// Created before any event: the push comes before the watcher joins a
	// group, and both happen under Hub.mu, which every event push holds.
	s.push(item{resp: &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: storeRev}, WatchId: id, Created: true}, force: true})
	if start > h.mu.rev {
		w.synced = true
		h.mu.synced.add(w)
	} else {
		h.mu.unsynced[w] = struct{}{}
		h.Notify()
	}
	return id, nil
}

// Cancel ends a watch and queues etcd's canceled response. It reports
// false, and queues nothing, for an unknown ID (etcd ignores those).
func (s *Stream) Cancel(id int64) bool {
	h := s.h
	h.mu.Lock()
	defer h.mu.Unlock()
	w := s.watchers[id]
	if w == nil {
		return false
	}
	h.removeLocked(w, true)
	s.push(item{resp: &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: h.src.Rev()}, WatchId: id, Canceled: true}, force: true})
	h.answerProgressLocked() // the canceled watcher may have been the one holding it back
	return true
}

// RequestProgress asks for a progress notification (watch ID -1) carrying
// a revision that every watcher of the stream has reached, at least the
// store's revision at the call. It is answered at once if the answer may
// speak for every watcher of the stream (invariant 5: all synced, none
// starting above the answer's revision, nothing later queued before it),
// else as soon as it may: when the watchers catching up have caught up
// and the revision has reached the highest start. etcd (since 3.5.13 and
// 3.6.0, server/etcdserver/api/v3rpc/watch.go) drops a request it cannot
// answer yet, and its clients ask again; a later answer serves them as
// well, and one asking once is not left waiting.
func (s *Stream) RequestProgress() {
	h := s.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return
	}
	need := h.src.Rev()
	if !h.tryProgressLocked(s, need) {
		h.mu.progress[s] = max(h.mu.progress[s], need)
		h.Notify()
	}
}

// Close removes every watcher of the stream; Next then returns ErrClosed.
func (s *Stream) Close() {
	h := s.h
	h.mu.Lock()
	for _, w := range s.watchers {
		h.removeLocked(w, true)
	}
	delete(h.mu.streams, s)
	delete(h.mu.progress, s)
	h.mu.Unlock()
	s.qmu.Lock()
	s.closed = true
	s.queue = nil
	h.queued.Add(-int64(s.bytes))
	s.bytes, s.events = 0, 0
	s.qmu.Unlock()
	if h.overfull.CompareAndSwap(true, false) {
		h.Notify()
	}
	s.signal()
}

// push queues a response. A droppable item is refused when QueueLen such
// items, or QueueBytes of keys and values, are queued already, or the
// hub's TotalQueueBytes, unless the queue is empty (then the stream is
// marked full and wakes the hub when it drains); a forced one is always
// queued.
func (s *Stream) push(it item) bool {
	s.qmu.Lock()
	if s.closed {
		s.qmu.Unlock()
		return true // nobody will read it; the watcher need not fall behind
	}
	if !it.force {
		it.size = payload(it.resp)
		if s.events >= s.h.opts.QueueLen || (s.events > 0 && s.bytes+it.size > s.h.opts.QueueBytes) {
			s.full = true
			s.qmu.Unlock()
			return false
		}
		if s.events > 0 && s.h.queued.Load()+int64(it.size) > s.h.opts.TotalQueueBytes {
			s.h.overfull.Store(true)
			s.qmu.Unlock()
			return false
		}
		s.events++
		s.bytes += it.size
		s.h.queued.Add(int64(it.size))
	}
	s.queue = append(s.queue, it)
	s.maxRev = max(s.maxRev, it.resp.GetHeader().GetRevision())
	s.qmu.Unlock()
	s.signal()
	return true
}

// maxQueuedRev returns the highest header revision queued on s so far.
func (s *Stream) maxQueuedRev() int64 {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return s.maxRev
}

func (s *Stream) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// hasRoom reports whether a droppable push may be accepted. If not, the
// stream wakes the hub when it drains, as after a refused push.
func (s *Stream) hasRoom() bool {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	if s.events >= s.h.opts.QueueLen || s.bytes >= s.h.opts.QueueBytes {
		s.full = true
		return false
	}
	if s.events > 0 && s.h.queued.Load() >= s.h.opts.TotalQueueBytes {
		s.h.overfull.Store(true)
		return false
	}
	return true
}

// Queued returns the number of responses waiting to be sent.
func (s *Stream) Queued() int {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return len(s.queue)
}

// WaitRoom blocks while the stream holds more than twice its queue
// length of responses, or until ctx ends. The receive loop calls it before
// each request, so a client that sends requests and reads nothing is held
// back (control responses are queued even when the queue is full).
func (s *Stream) WaitRoom(ctx context.Context) error {
	for {
		s.qmu.Lock()
		n, closed := len(s.queue), s.closed
		s.qmu.Unlock()
		if closed {
			return ErrClosed
		}
		if n <= 2*s.h.opts.QueueLen {
			return nil
		}
		select {
		case <-s.room:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Next returns the next response to send, waiting for one until ctx ends
// or the stream closes (ErrClosed). Responses of watchers the client
// canceled after they were queued are dropped, as etcd drops them; those
// of a watcher compaction canceled are sent, before its compacted answer.
func (s *Stream) Next(ctx context.Context) (Response, error) {
	for {
		s.qmu.Lock()
		if s.closed {
			s.qmu.Unlock()
			return Response{}, ErrClosed
		}
		if len(s.queue) > 0 {
			it := s.queue[0]
			s.queue[0] = item{}
			s.queue = s.queue[1:]
			if len(s.queue) == 0 {
				s.queue = nil // let the backing array go
			}
			if !it.force {
				s.events--
				s.bytes -= it.size
				s.h.queued.Add(-int64(it.size))
			}
			wake := s.full
			s.full = false
			canceled := it.w != nil && it.w.discard
			s.qmu.Unlock()
			select {
			case s.room <- struct{}{}:
			default:
			}
			if wake || (it.size > 0 && s.h.overfull.CompareAndSwap(true, false)) {
				s.h.Notify()
			}
			if canceled {
				continue
			}
			return Response{WatchResponse: it.resp, Fragment: it.w != nil && it.w.fragment}, nil
		}
		s.qmu.Unlock()
		select {
		case <-s.ready:
		case <-ctx.Done():
			return Response{}, ctx.Err()
		}
	}
}
