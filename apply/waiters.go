package apply

import (
	"bytes"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// Waiters is where clients wait for the results of the requests they
// proposed, by request ID. The proposer registers a request before it
// proposes it; the applier answers it once the request's entry is applied
// (or an install covered it). It is its own type, not the applier's,
// because the proposer and the lessor that proposes exist before the
// applier that answers.
//
// Invariant: each registered request is answered at most once, and an
// answered or cancelled request is forgotten (no channel is kept after).
//
// Safe for concurrent use.
type Waiters struct {
	mu      sync.Mutex
	waiting map[uint64]waiter // request ID -> its client; guarded by mu
}

// waiter is a client waiting for its request's result: the channel it
// reads, and for a request registered with RegisterRequest the request
// and the bytes proposed for it.
type waiter struct {
	c    chan Result
	req  *pb.InternalRaftRequest
	data []byte
}

// NewWaiters returns an empty registry.
func NewWaiters() *Waiters {
	return &Waiters{waiting: map[uint64]waiter{}}
}

// Register returns the channel on which the result of the request with
// this ID will be delivered once applied. Call it before proposing.
func (w *Waiters) Register(id uint64) <-chan Result {
	return w.register(id, waiter{c: make(chan Result, 1)})
}

// RegisterRequest is Register for a request proposed as data, its
// encoding. The applier of this member may apply req itself, in place of
// decoding the entry, when the entry holds exactly data: a member decodes
// none of the requests its own clients proposed (Applier.request).
//
// Invariant (the caller's): req is not changed from here on, by the
// caller or anyone it hands req to; the applier only reads it.
func (w *Waiters) RegisterRequest(id uint64, req *pb.InternalRaftRequest, data []byte) <-chan Result {
	return w.register(id, waiter{c: make(chan Result, 1), req: req, data: data})
}

func (w *Waiters) register(id uint64, wt waiter) <-chan Result {
	w.mu.Lock()
	w.waiting[id] = wt
	w.mu.Unlock()
	return wt.c
}

// proposed returns the request registered under id if its encoding is
// data, byte for byte: then decoding data would give an equal request. It
// returns nil otherwise (another member proposed it, its client gave up,
// or the entry is not what was proposed).
func (w *Waiters) proposed(id uint64, data []byte) *pb.InternalRaftRequest {
	w.mu.Lock()
	wt, ok := w.waiting[id]
	w.mu.Unlock()
	if !ok || wt.req == nil || !bytes.Equal(wt.data, data) {
		return nil
	}
	return wt.req
}

// Cancel forgets a registered request whose client gave up.
func (w *Waiters) Cancel(id uint64) {
	w.mu.Lock()
	delete(w.waiting, id)
	w.mu.Unlock()
}

// Answer delivers the result of request id to its client, if it still
// waits. The applier answers through it (and through answer, for a
// batch); so does anything that stands in for an applier.
func (w *Waiters) Answer(id uint64, res Result) {
	w.answer([]answer{{id: id, result: res}})
}

// answer delivers results to the clients still waiting for them.
func (w *Waiters) answer(answers []answer) {
	if len(answers) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ans := range answers {
		if wt, ok := w.waiting[ans.id]; ok {
			wt.c <- ans.result
			delete(w.waiting, ans.id)
		}
	}
}

// ids returns the requests waiting now.
func (w *Waiters) ids() []uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]uint64, 0, len(w.waiting))
	for id := range w.waiting {
		ids = append(ids, id)
	}
	return ids
}
