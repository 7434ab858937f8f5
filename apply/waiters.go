package apply

import "sync"

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
	waiting map[uint64]chan Result // request ID -> its client's channel; guarded by mu
}

// NewWaiters returns an empty registry.
func NewWaiters() *Waiters {
	return &Waiters{waiting: map[uint64]chan Result{}}
}

// Register returns the channel on which the result of the request with
// this ID will be delivered once applied. Call it before proposing.
func (w *Waiters) Register(id uint64) <-chan Result {
	c := make(chan Result, 1)
	w.mu.Lock()
	w.waiting[id] = c
	w.mu.Unlock()
	return c
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
		if c, ok := w.waiting[ans.id]; ok {
			c <- ans.result
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
