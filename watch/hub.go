package watch

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/mvcc"
)

// Errors a watch creation is refused with; the server sends them as the
// created-and-canceled response's cancel_reason, with etcd's texts.
var (
	// ErrEmptyRange: range_end is not above key.
	ErrEmptyRange = errors.New("mvcc: watcher range is empty")
	// ErrDuplicateID: the client chose a watch ID in use on the stream.
	ErrDuplicateID = errors.New("mvcc: duplicate watch ID provided on the WatchStream")
	// ErrNegativeStart: start_revision is below 0. etcd refuses such a
	// watch with the text of its compacted error whatever the compact
	// revision (see Stream.Watch), so a client sees ErrCompacted.
	ErrNegativeStart = errors.New(rpctypes.ErrCompacted.Error())
	// ErrClosed: the hub or the stream was closed.
	ErrClosed = errors.New("watch: closed")
)

// ProgressWatchID is the watch ID of the answer to a RequestProgress: it
// speaks for every watcher of the stream (clientv3.InvalidWatchID).
const ProgressWatchID = -1

// Source is what the hub reads: *mvcc.Store.
type Source interface {
	// Rev is the revision of committed state.
	Rev() int64
	// CompactRev is the compact revision (-1: none).
	CompactRev() int64
	// Events reads the events of revisions [from, to] from an engine
	// snapshot, at most limit of them but never part of a revision, and
	// returns the first revision not read; mvcc.ErrCompacted if from is
	// below the compact revision.
	Events(from, to int64, limit int, prevKV bool) ([]*mvccpb.Event, int64, error)
}

// Options configure a Hub.
type Options struct {
	// ProgressInterval is how often watchers created with progress_notify
	// get an empty response carrying the revision they have reached, when
	// they are synced (etcd's --watch-progress-notify-interval). 0 means
	// 10 minutes, etcd's default.
	ProgressInterval time.Duration
	// QueueLen bounds the responses a stream queues for its client; a
	// watcher whose response does not fit falls behind (unsynced) and
	// catches up from the engine later. 0 means 1024.
	QueueLen int
	// QueueBytes bounds the keys and values (previous ones included) a
	// stream queues, the same way; a response is always accepted by an
	// empty queue, so one larger than the bound still goes. 0 means 16 MiB.
	QueueBytes int
	// TotalQueueBytes bounds the keys and values queued on all streams
	// together: past it, only streams with an empty queue accept a
	// response. 0 means 256 MiB.
	TotalQueueBytes int64
	// ScanLimit bounds the events one engine scan returns. 0 means 1000.
	ScanLimit int
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
}

// Hub delivers the store's events to watchers. See the package comment.
//
// Concurrency: all methods are safe from any goroutine. Start runs the
// hub goroutine until Close.
type Hub struct {
	src  Source
	opts Options
	lg   *zap.Logger

	kick chan struct{} // wakes the hub goroutine; capacity 1
	// queued counts the keys and values queued on every stream; overfull
	// is set when a push was refused for the total bound, so that the
	// next stream to drain wakes the hub.
	queued   atomic.Int64
	overfull atomic.Bool
	stop     chan struct{}
	stopped  chan struct{}
	once     sync.Once
	started  bool // Start and Close are called from one goroutine

	mu struct {
		sync.Mutex
		// rev is the hub's revision: every synced watcher has been
		// offered every event up to rev.
		rev      int64
		synced   *group
		unsynced map[*watcher]struct{}
		// lastPassEnd is the last revision the previous catch-up pass
		// read (catchUp).
		lastPassEnd int64
		// progress are streams owed an answer to RequestProgress once
		// the hub has reached the store revision of the request (so that
		// a client sees, as with etcd, a revision at least that of the
		// writes it saw acknowledged) and may speak for every watcher of
		// the stream (invariant 5).
		progress map[*Stream]int64
		streams  map[*Stream]struct{}
		closed   bool
	}
}

// watcher is one watch. Its range and options never change after
// creation; nextRev and the group it is in are guarded by Hub.mu.
type watcher struct {
	s        *Stream
	id       int64
	key, end []byte // end: nil for one key, empty for every key >= key
	prevKV   bool
	progress bool
	fragment bool
	noPut    bool
	noDelete bool

	// startRev is the start revision the client asked for, 0 for the
	// next one: what the client already knows it has seen everything
	// before, so no progress notification may speak for it below.
	startRev int64
	nextRev  int64 // first revision not yet offered (guarded by Hub.mu)
	synced   bool  // in Hub.mu.synced, else in Hub.mu.unsynced (guarded by Hub.mu)
	canceled bool  // out of the hub's groups for good (guarded by Hub.mu)
	// discard is set when the client canceled the watch or closed the
	// stream: Stream.Next drops its queued responses. A watch canceled
	// by compaction keeps them, and its ID, as etcd does. Set under
	// Hub.mu and qmu; read by Stream.Next under qmu.
	discard bool
	pos     int // index in its group's list (guarded by Hub.mu)
	// eventsSinceTick is set when events were queued for the watcher since
	// the last periodic progress tick: the next tick sends it no progress
	// notification, as etcd elides it after a key update (guarded by
	// Hub.mu).
	eventsSinceTick bool
}

// New returns a hub over src, at src's current revision. It starts no
// goroutine.
func New(src Source, opts Options) *Hub {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.ProgressInterval <= 0 {
		opts.ProgressInterval = 10 * time.Minute
	}
	if opts.QueueLen <= 0 {
		opts.QueueLen = 1024
	}
	if opts.QueueBytes <= 0 {
		opts.QueueBytes = 16 << 20
	}
	if opts.TotalQueueBytes <= 0 {
		opts.TotalQueueBytes = 256 << 20
	}
	if opts.ScanLimit <= 0 {
		opts.ScanLimit = 1000
	}
	h := &Hub{src: src, opts: opts, lg: opts.Logger, kick: make(chan struct{}, 1),
		stop: make(chan struct{}), stopped: make(chan struct{})}
	h.mu.rev = src.Rev()
	h.mu.synced = newGroup()
	h.mu.unsynced = map[*watcher]struct{}{}
	h.mu.progress = map[*Stream]int64{}
	h.mu.streams = map[*Stream]struct{}{}
	return h
}

// Start starts the hub goroutine.
func (h *Hub) Start() {
	if h.started {
		return
	}
	h.started = true
	go h.run()
}

// Close stops the hub goroutine and ends every stream: their Next returns
// ErrClosed.
func (h *Hub) Close() {
	h.once.Do(func() {
		close(h.stop)
		if h.started {
			<-h.stopped
		}
		h.mu.Lock()
		h.mu.closed = true
		streams := h.mu.streams
		h.mu.streams = map[*Stream]struct{}{}
		h.mu.Unlock()
		for s := range streams {
			s.qmu.Lock()
			s.closed = true
			s.qmu.Unlock()
			s.signal()
		}
	})
}

// Notify tells the hub that the store's revision may have moved. It never
// blocks: the applier calls it after every commit.
func (h *Hub) Notify() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// Rev returns the hub's revision: every synced watcher has been offered
// every event up to it.
func (h *Hub) Rev() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.rev
}

// Stats counts watchers, for tests and metrics.
type Stats struct {
	Streams, Synced, Unsynced int
}

// Stats returns the current watcher counts.
func (h *Hub) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Stats{Streams: len(h.mu.streams), Synced: h.mu.synced.n, Unsynced: len(h.mu.unsynced)}
}

func (h *Hub) run() {
	defer close(h.stopped)
	tick := time.NewTicker(h.opts.ProgressInterval)
	defer tick.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-h.kick:
		case <-tick.C:
			h.progressNotify()
		}
		for {
			select {
			case <-h.stop:
				return
			default:
			}
			moreSynced, err := h.dispatch()
			if err != nil {
				h.lg.Error("watch: reading events failed; retrying on the next commit", zap.Error(err))
				break
			}
			moreUnsynced, err := h.catchUp()
			if err != nil {
				h.lg.Error("watch: catching up watchers failed; retrying on the next commit", zap.Error(err))
				break
			}
			if !moreSynced && !moreUnsynced {
				break
			}
		}
	}
}

// dispatch offers the events after the hub's revision to the synced
// watchers, one scan for all of them, and reports whether the store is
// still ahead.
func (h *Hub) dispatch() (more bool, err error) {
	target := h.src.Rev()
	h.mu.Lock()
	from := h.mu.rev
	if target <= from {
		h.mu.Unlock()
		return false, nil
	}
	if h.mu.synced.n == 0 {
		h.mu.rev = target
		h.answerProgressLocked()
		h.mu.Unlock()
		return false, nil
	}
	wantPrev := h.mu.synced.prev > 0
	h.mu.Unlock()

	// The scan reads every event, without the lock: Watch and Cancel go on
	// meanwhile, and matching happens below against the group as it is
	// then. A watcher added meanwhile is synced only if its next revision
	// is above from, so it wants no event this scan misses.
	evs, next, err := h.src.Events(from+1, target, h.opts.ScanLimit, wantPrev)
	h.mu.Lock()
	defer h.mu.Unlock()
	if errors.Is(err, mvcc.ErrCompacted) {
		// Compacted past revisions not yet dispatched: every synced
		// watcher falls back and the catch-up pass cancels those that need
		// compacted revisions, as etcd does.
		for _, w := range h.syncedList() {
			h.unsyncLocked(w, from+1)
		}
		h.mu.rev = max(h.mu.rev, target)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("dispatch (%d, %d]: %w", from, target, err)
	}
	if !wantPrev && h.mu.synced.prev > 0 {
		// A watcher that wants previous versions joined the group during
		// the scan, which read none: read again, with them.
		return true, nil
	}
	through := next - 1
	per := map[*watcher][]*mvccpb.Event{}
	var order []*watcher
	for _, ev := range evs {
		h.mu.synced.each(ev.Kv.Key, func(w *watcher) {
			if !w.wants(ev) {
				return
			}
			if _, ok := per[w]; !ok {
				order = append(order, w)
			}
			per[w] = append(per[w], w.shape(ev))
		})
	}
	for _, w := range order {
		resp := &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: through}, WatchId: w.id, Events: per[w]}
		if !w.s.push(item{resp: resp, w: w}) {
			h.unsyncLocked(w, from+1)
			continue
		}
		w.eventsSinceTick = true
	}
	h.mu.rev = through
	h.answerProgressLocked()
	return through < target, nil
}

// syncedAll iterates the synced group. REQUIRES: h.mu held.
func (h *Hub) syncedAll() func(yield func(*watcher) bool) {
	return func(yield func(*watcher) bool) {
		for _, l := range h.mu.synced.keys {
			for _, w := range l {
				if !yield(w) {
					return
				}
			}
		}
		for _, w := range h.mu.synced.ranges {
			if !yield(w) {
				return
			}
		}
	}
}

// syncedList copies the synced group. REQUIRES: h.mu held.
func (h *Hub) syncedList() []*watcher {
	var out []*watcher
	for w := range h.syncedAll() {
		out = append(out, w)
	}
	return out
}

// unsyncLocked moves a synced watcher to unsynced; from is the first
// revision it has not been offered. REQUIRES: h.mu held.
func (h *Hub) unsyncLocked(w *watcher, from int64) {
	if !w.synced {
		return
	}
	h.mu.synced.remove(w)
	w.synced = false
	w.nextRev = max(w.nextRev, from)
	h.mu.unsynced[w] = struct{}{}
}

// syncLocked moves an unsynced watcher to synced. REQUIRES: h.mu held.
func (h *Hub) syncLocked(w *watcher) {
	if w.synced {
		return
	}
	delete(h.mu.unsynced, w)
	w.synced = true
	h.mu.synced.add(w)
}

// catchUp runs one catch-up pass for the unsynced watchers whose streams
// have room, and reports whether another pass may make progress.
func (h *Hub) catchUp() (more bool, err error) {
	h.mu.Lock()
	if len(h.mu.unsynced) == 0 {
		h.mu.Unlock()
		return false, nil
	}
	hubRev := h.mu.rev
	// A pass starts at the lowest next revision above where the previous
	// pass ended, or, if no watcher is there, at the lowest of all: a
	// watcher far behind then takes turns with the others instead of
	// holding back, pass after pass, those that need only recent
	// revisions.
	var room []*watcher
	minAll, minAbove := int64(-1), int64(-1)
	for w := range h.mu.unsynced {
		if !w.s.hasRoom() {
			continue
		}
		room = append(room, w)
		if minAll < 0 || w.nextRev < minAll {
			minAll = w.nextRev
		}
		if w.nextRev > h.mu.lastPassEnd+1 && (minAbove < 0 || w.nextRev < minAbove) {
			minAbove = w.nextRev
		}
	}
	minRev := minAbove
	if minRev < 0 {
		minRev = minAll
	}
	pass := newGroup()
	var ws []*watcher
	for _, w := range room {
		if w.nextRev >= minRev {
			// pos of an unsynced watcher is unused by the hub's groups, so
			// the pass group may own it until the watcher is synced again.
			pass.add(w)
			ws = append(ws, w)
		}
	}
	h.mu.Unlock()
	if len(ws) == 0 {
		return false, nil
	}
	wantPrev := false
	for _, w := range ws {
		wantPrev = wantPrev || w.prevKV
	}
	evs, next, err := h.src.Events(minRev, hubRev, h.opts.ScanLimit, wantPrev)
	h.mu.Lock()
	defer h.mu.Unlock()
	if errors.Is(err, mvcc.ErrCompacted) {
		compactRev := h.src.CompactRev()
		for _, w := range ws {
			if w.canceled || w.nextRev >= compactRev {
				continue
			}
			h.removeLocked(w, false)
			// etcd's compacted answer carries header revision 0.
			w.s.push(item{resp: &pb.WatchResponse{
				Header: &pb.ResponseHeader{}, WatchId: w.id,
				CompactRevision: compactRev, Canceled: true,
			}, force: true})
		}
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("catch up from %d: %w", minRev, err)
	}
	through := max(next-1, minRev-1)
	h.mu.lastPassEnd = through
	per := map[*watcher][]*mvccpb.Event{}
	for _, ev := range evs {
		pass.each(ev.Kv.Key, func(w *watcher) {
			if !w.canceled && w.wants(ev) {
				per[w] = append(per[w], w.shape(ev))
			}
		})
	}
	delivered := false
	for _, w := range ws {
		if w.canceled || w.synced {
			continue
		}
		if evs := per[w]; len(evs) > 0 {
			resp := &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: through}, WatchId: w.id, Events: evs}
			if !w.s.push(item{resp: resp, w: w}) {
				continue
			}
			w.eventsSinceTick = true
		}
		delivered = true
		w.nextRev = max(w.nextRev, through+1)
		if through >= h.mu.rev {
			h.syncLocked(w)
		}
	}
	h.answerProgressLocked()
	return delivered && len(h.mu.unsynced) > 0, nil
}

// wants applies the watcher's filters and its start revision.
func (w *watcher) wants(ev *mvccpb.Event) bool {
	if ev.Kv.ModRevision < w.nextRev {
		return false
	}
	if ev.Type == mvccpb.PUT {
		return !w.noPut
	}
	return !w.noDelete
}

// shape returns ev as w receives it: without the previous version unless
// w asked for it. Events are shared between watchers and never modified.
func (w *watcher) shape(ev *mvccpb.Event) *mvccpb.Event {
	if w.prevKV || ev.PrevKv == nil {
		return ev
	}
	return &mvccpb.Event{Type: ev.Type, Kv: ev.Kv}
}

// removeLocked takes a watcher out of the hub's groups. With discard (the
// client canceled it, or closed its stream) its queued responses are
// dropped and its ID is free again; without (compaction canceled it) the
// client still gets what was queued before the compacted answer, and the
// ID stays in use until the client cancels it, as in etcd. REQUIRES: h.mu
// held.
func (h *Hub) removeLocked(w *watcher, discard bool) {
	if !w.canceled {
		if w.synced {
			h.mu.synced.remove(w)
		} else {
			delete(h.mu.unsynced, w)
		}
		w.canceled = true
	}
	if discard {
		w.s.qmu.Lock()
		w.discard = true
		w.s.qmu.Unlock()
		delete(w.s.watchers, w.id)
	}
}

// progressNotify sends each synced watcher created with progress_notify
// the hub's revision, if it may (invariant 5), its stream has room (etcd
// skips it otherwise; either way the next tick tries again), and it was
// sent no events since the last tick (etcd's sendLoop elides the next
// notification after a key update).
func (h *Hub) progressNotify() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.syncedAll() {
		recent := w.eventsSinceTick
		w.eventsSinceTick = false
		if recent || !w.progress || !h.speaksForLocked(w) || h.mu.rev < w.s.maxQueuedRev() {
			continue
		}
		w.s.push(item{resp: &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: h.mu.rev}, WatchId: w.id}, w: w})
	}
	for w := range h.mu.unsynced {
		w.eventsSinceTick = false
	}
}

// speaksForLocked reports whether a progress notification at the hub's
// revision may speak for w: w is synced, so it has been offered every
// event up to that revision; its next revision is at most the one after
// (a watcher created from the next revision while the hub lagged the
// store starts above it); and the start revision the client chose, if
// any, is not above it. A client that asked to start at N holds
// everything before N, perhaps from another member: a notification
// below N would take it back in time, and clientv3 would resume the
// watch from there and get events again. etcd's progressIfSync
// (server/storage/mvcc/watchable_store.go) makes the same check on the
// start revision, for requested and periodic notifications alike.
// REQUIRES: h.mu held.
func (h *Hub) speaksForLocked(w *watcher) bool {
	rev := h.mu.rev
	return w.synced && w.nextRev <= rev+1 && w.startRev <= rev
}

// answerProgressLocked answers the pending RequestProgress calls that
// may now be answered (invariant 5). REQUIRES: h.mu held.
func (h *Hub) answerProgressLocked() {
	for s, need := range h.mu.progress {
		if h.tryProgressLocked(s, need) {
			delete(h.mu.progress, s)
		}
	}
}

// tryProgressLocked queues a progress answer on s if the hub has reached
// need and the answer may speak for every watcher of s (invariant 5).
// REQUIRES: h.mu held.
func (h *Hub) tryProgressLocked(s *Stream, need int64) bool {
	live := false
	for _, w := range s.watchers {
		live = live || !w.canceled
	}
	if !live {
		// Nothing to speak for: etcd's progressIfSync sends nothing to a
		// stream without watchers, and neither do we.
		return true
	}
	if h.mu.rev < need || h.mu.rev < s.maxQueuedRev() {
		return false
	}
	for _, w := range s.watchers {
		if !w.canceled && !h.speaksForLocked(w) {
			return false
		}
	}
	s.push(item{resp: &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: h.mu.rev}, WatchId: ProgressWatchID}, force: true})
	return true
}

// validRange checks a watch range as etcd does.
func validRange(key, end []byte) error {
	if len(end) > 0 && bytes.Compare(key, end) >= 0 {
		return ErrEmptyRange
	}
	return nil
}
