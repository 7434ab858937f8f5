// Package lease is strata's lessor: etcd's leases (Grant, Revoke,
// KeepAlive, TimeToLive, Leases), with expiry decided by the leader and
// carried out through raft.
//
// # Where lease state lives
//
// Every change to the set of leases is a replicated request applied by the
// applier (package apply), never a local decision: LeaseGrant, LeaseRevoke
// and LeaseCheckpoint entries are applied through Grant, Revoke and
// Checkpoint, which write the lease records (mvcc.LeaseRecord: ID, granted
// TTL, remaining TTL at the last checkpoint) into the applier's batch, so
// the records commit with the applied index like any key. Revoking deletes
// every attached key in one revision (mvcc.WriteBatch.RevokeLease). At
// start-up Load rebuilds the in-memory table from the lease records alone
// (one engine record per lease, never the keys).
//
// # Who decides expiry
//
// Only the leader (the "primary" lessor) tracks deadlines. Run watches the
// member's leadership: on becoming leader the lessor is promoted, and every
// lease's deadline becomes now + (its checkpointed remaining TTL, or its
// TTL) + one election timeout, as etcd's Promote extends leases so that
// clients of the old leader have time to find the new one. While primary,
// Run proposes LeaseRevoke for each lease past its deadline (retrying a
// revoke every few seconds until it applies), once a quorum has confirmed
// that this member still leads (Raft.ConfirmLeader: a leader that stalled
// past an election timeout still believes it leads), and, every CheckpointInterval,
// one LeaseCheckpoint carrying the remaining TTL of each lease that has
// run down since granted or renewed. A follower keeps no deadlines: its
// leases live until a revoke arrives through raft.
//
// KeepAlive (Renew) is answered by the leader alone: it moves the deadline
// to now + TTL, once Raft.EnsureLeader says this member may (at once while
// raft's loop ticks; after a stall, once a quorum confirms it still leads,
// as etcd's ensureLeadership). When the lease carries a checkpointed remaining TTL, Renew
// first proposes a checkpoint that clears it, so that a restart after the
// renewal does not resurrect the older, shorter deadline (etcd does the
// same), waiting for it at most Config.RequestTimeout.
//
// # Concurrency
//
// Grant, Revoke, Checkpoint and Load are called by the applier goroutine
// (Load also before it runs). Renew, TimeToLive, Leases and Exists are safe
// from any goroutine. Run is one goroutine per member. Lessor state is
// changed in memory when a request is applied, before the applier commits
// its batch: a later request of the same batch must see it (a Put naming a
// lease granted just before), and a failed commit stops the member.
package lease

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/mvcc"
)

// MaxLeaseTTL is the largest TTL a grant may ask for, in seconds (etcd's).
const MaxLeaseTTL = 9000000000

// Errors with etcd's meanings; the server maps them to rpctypes codes.
var (
	// ErrLeaseNotFound: no lease with that ID exists. It is mvcc's error so
	// that a Put naming a missing lease maps to the same code.
	ErrLeaseNotFound = mvcc.ErrLeaseNotFound
	// ErrLeaseExists: a grant names an ID already granted.
	ErrLeaseExists = errors.New("lease already exists")
	// ErrLeaseTTLTooLarge: a grant asks for more than MaxLeaseTTL.
	ErrLeaseTTLTooLarge = errors.New("too large lease TTL")
	// ErrNotPrimary: this member is not the leader, which alone renews
	// leases and knows their deadlines.
	ErrNotPrimary = errors.New("not a primary lessor")
)

// Defaults of Config.
const (
	// DefaultCheckpointInterval is how often the leader records remaining
	// TTLs. etcd's default is 5 minutes; strata keeps remaining TTLs across
	// restarts, so it checkpoints far more often (one small raft entry per
	// interval while any lease runs down).
	DefaultCheckpointInterval = 5 * time.Second
	// defaultTick is how often Run looks for expired leases (etcd: 500 ms).
	defaultTick = 250 * time.Millisecond
	// revokeRetry is how long Run waits before proposing again the revoke
	// of a lease that is still there (etcd's expiredLeaseRetryInterval).
	revokeRetry = 3 * time.Second
	// maxCheckpointBatch bounds the checkpoints of one raft entry (etcd's).
	maxCheckpointBatch = 1000
	// maxRevokesPerTick bounds the revokes proposed per tick, so that a
	// pile of leases expiring together does not flood raft (etcd limits
	// revokes to 1000 per second).
	maxRevokesPerTick = 250
)

// Clock is the lessor's time source; tests inject a fake.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Raft is what the lessor needs to know of raft and the state machine.
type Raft interface {
	// IsLeader reports whether this member is the raft leader.
	IsLeader() bool
	// LastIndex and AppliedIndex report the last index of the raft log and
	// the applied index. A new leader is promoted only once it has applied
	// its log as it was when it noticed its leadership (a leader's log
	// holds every committed entry), so that deadlines count from the
	// checkpoints and grants the log holds, not from what the engine had
	// before replay.
	LastIndex() uint64
	AppliedIndex() uint64
	// ConfirmLeader returns nil once a quorum has confirmed this member is
	// still the leader (a read-index round). The primary asks before it
	// revokes expired leases: a leader that stalled past an election
	// timeout still sees itself as leader, while clients keep their leases
	// alive through the new one (etcd #15247).
	ConfirmLeader(ctx context.Context) error
	// EnsureLeader returns nil if this member may act as the leader
	// alone: at once while raft's loop ticks, else after ConfirmLeader
	// (etcd's ensureLeadership). The primary asks before each renewal, so
	// that a leader whose loop stalled, and which others may have
	// replaced, does not extend leases the new leader will revoke.
	EnsureLeader(ctx context.Context) error
}

// Proposer replicates a request through raft and waits until it is
// applied; Submit returns the request's error, if any (propose.Proposer).
type Proposer interface {
	Submit(ctx context.Context, req *pb.InternalRaftRequest) error
}

// MinTTL is etcd's minimum lease TTL, in seconds, for a raft heartbeat
// interval and election timeout: a lease outlives an election (1.5 election
// timeouts, at least two heartbeats' worth, rounded up to a second). 0 if
// the heartbeat interval is not set.
func MinTTL(heartbeat, electionTimeout time.Duration) int64 {
	if heartbeat <= 0 {
		return 0
	}
	electionTicks := int(electionTimeout / heartbeat)
	minTTL := time.Duration(3*max(electionTicks, 2)/2) * heartbeat
	return int64(math.Ceil(minTTL.Seconds()))
}

// DefaultRequestTimeout is Config.RequestTimeout when 0: etcd's request
// timeout for the default election timeout (5 s plus two of 1 s).
const DefaultRequestTimeout = 7 * time.Second

// Config configures a Lessor.
type Config struct {
	// MinTTL is the smallest TTL a lease gets, in seconds: a grant asking
	// less is raised to it (etcd: ceil(1.5 election timeouts)), so that a
	// lease cannot expire during an election.
	MinTTL int64
	// ElectionTimeout extends every lease when this member becomes leader.
	ElectionTimeout time.Duration
	// CheckpointInterval: see DefaultCheckpointInterval; 0 means that,
	// negative turns checkpointing off.
	CheckpointInterval time.Duration
	// Tick is how often Run looks for expired leases; 0 means 250 ms.
	Tick time.Duration
	// Raft tells leadership and progress; nil: never leader (the lessor
	// only applies, as in recovery and tests).
	Raft Raft
	// Proposer replicates the lessor's revocations and checkpoints; nil:
	// none are proposed.
	Proposer Proposer
	// RequestTimeout bounds the raft round a renewal waits for when it
	// clears the lease's checkpoint: a proposal that a leader change drops
	// is never answered, and a keepalive stream waiting on it would hang
	// with every lease it carries (etcd bounds the same call by its request
	// timeout). 0 means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Clock; nil means the real clock.
	Clock Clock
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
}

// lease is one lease in memory.
type lease struct {
	id  int64
	ttl int64 // granted TTL, seconds
	// remaining is the persisted checkpoint, seconds (0: none).
	remaining int64
	// expiry is the deadline; meaningful only while the lessor is primary.
	expiry time.Time
	// due is when Run next looks at the lease: its expiry, or after a
	// proposed revoke the time to retry it.
	due time.Time
	// index in the heap; -1 when not in it.
	index int
}

// Lessor holds the leases of one member. See the package comment.
//
// Invariants: every lease in mu.leases is in mu.heap while mu.primary, and
// none is while not; mu.heap is ordered by due.
type Lessor struct {
	cfg   Config
	clock Clock
	lg    *zap.Logger

	mu struct {
		sync.Mutex
		leases  map[int64]*lease
		heap    dueHeap
		primary bool
		// lastCheckpoint is when the primary last proposed checkpoints.
		lastCheckpoint time.Time
	}
	// promoteAt is the index the applier must reach before a leader's
	// lessor is promoted; 0 while not waiting. Only Run's goroutine uses it.
	promoteAt uint64
}

// New returns an empty lessor; call Load to fill it from the store.
func New(cfg Config) *Lessor {
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.CheckpointInterval == 0 {
		cfg.CheckpointInterval = DefaultCheckpointInterval
	}
	if cfg.Tick <= 0 {
		cfg.Tick = defaultTick
	}
	if cfg.MinTTL < 1 {
		cfg.MinTTL = 1
	}
	l := &Lessor{cfg: cfg, clock: cfg.Clock, lg: cfg.Logger}
	l.mu.leases = map[int64]*lease{}
	return l
}

// Load replaces the lessor's table with the lease records of store: at
// start-up, and after a raft snapshot replaced the store's content. It
// reads one engine record per lease and no key. A primary lessor gives
// every loaded lease a fresh deadline, as on promotion.
func (l *Lessor) Load(store *mvcc.Store) error {
	recs, err := store.Leases()
	if err != nil {
		return fmt.Errorf("load leases: %w", err)
	}
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.leases = make(map[int64]*lease, len(recs))
	l.mu.heap = nil
	for _, r := range recs {
		le := &lease{id: r.ID, ttl: r.TTL, remaining: r.RemainingTTL, index: -1}
		l.mu.leases[r.ID] = le
		if l.mu.primary {
			l.startLocked(le, now, l.cfg.ElectionTimeout)
		}
	}
	return nil
}

// Exists reports whether lease id exists (mvcc.Leases: the applier gives
// the lessor to each write batch).
func (l *Lessor) Exists(id int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.mu.leases[id]
	return ok
}

// Grant applies a LeaseGrant: it records a new lease in w. A TTL below
// MinTTL is raised to it; the response carries the TTL granted.
func (l *Lessor) Grant(w *mvcc.WriteBatch, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	if r.ID == 0 {
		return nil, ErrLeaseNotFound // etcd's answer for the "no lease" ID
	}
	if r.TTL > MaxLeaseTTL {
		return nil, ErrLeaseTTLTooLarge
	}
	ttl := max(r.TTL, l.cfg.MinTTL)
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.mu.leases[r.ID]; ok {
		return nil, ErrLeaseExists
	}
	if err := w.PutLease(mvcc.LeaseRecord{ID: r.ID, TTL: ttl}); err != nil {
		return nil, err
	}
	le := &lease{id: r.ID, ttl: ttl, index: -1}
	l.mu.leases[r.ID] = le
	if l.mu.primary {
		l.startLocked(le, l.clock.Now(), 0)
	}
	return &pb.LeaseGrantResponse{Header: &pb.ResponseHeader{Revision: w.Rev()}, ID: r.ID, TTL: ttl}, nil
}

// Revoke applies a LeaseRevoke: it deletes the lease and, in one revision,
// every key attached to it.
func (l *Lessor) Revoke(w *mvcc.WriteBatch, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	le, ok := l.mu.leases[r.ID]
	if !ok {
		return nil, ErrLeaseNotFound
	}
	rev, _, err := w.RevokeLease(r.ID)
	if err != nil {
		return nil, err
	}
	delete(l.mu.leases, r.ID)
	if le.index >= 0 {
		heap.Remove(&l.mu.heap, le.index)
	}
	return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: rev}}, nil
}

// Forget drops lease id from memory only, if it exists: its record and
// its keys are the caller's business. An incremental snapshot install
// replays a compacted batch's kept revocation this way (the deletions of
// the lease's keys are records of their own in the batch) and needs the
// lease gone before later entries of the same engine batch ask whether it
// exists; the lessor is reloaded from the engine after the install.
func (l *Lessor) Forget(id int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	le, ok := l.mu.leases[id]
	if !ok {
		return
	}
	delete(l.mu.leases, id)
	if le.index >= 0 {
		heap.Remove(&l.mu.heap, le.index)
	}
}

// Checkpoint applies a LeaseCheckpoint: it records the remaining TTL of
// each named lease that still exists (0 clears it). The deadlines the
// primary keeps do not move: the checkpoint was taken from them.
func (l *Lessor) Checkpoint(w *mvcc.WriteBatch, r *pb.LeaseCheckpointRequest) (*pb.LeaseCheckpointResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, cp := range r.Checkpoints {
		le, ok := l.mu.leases[cp.ID]
		if !ok || cp.Remaining_TTL < 0 {
			continue
		}
		if err := w.PutLease(mvcc.LeaseRecord{ID: le.id, TTL: le.ttl, RemainingTTL: cp.Remaining_TTL}); err != nil {
			return nil, err
		}
		le.remaining = cp.Remaining_TTL
	}
	return &pb.LeaseCheckpointResponse{Header: &pb.ResponseHeader{Revision: w.Rev()}}, nil
}

// Renew keeps lease id alive: its deadline becomes now + TTL. Only the
// primary renews (ErrNotPrimary otherwise), once it has confirmed it still
// leads. A lease past its deadline is not renewed: its revoke is on the
// way, and the answer is ErrLeaseNotFound, as etcd's. Leadership is
// confirmed before the deadline is read, as etcd confirms it first: a
// leader that stalled, or was cut off while its clients still reach it,
// would otherwise answer TTL 0 (clientv3 then ends the keep-alive) for a
// lease a newer leader has kept alive.
func (l *Lessor) Renew(ctx context.Context, id int64) (ttl int64, err error) {
	l.mu.Lock()
	primary := l.mu.primary
	l.mu.Unlock()
	if !primary {
		return 0, ErrNotPrimary
	}
	timeout := l.cfg.RequestTimeout
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	if l.cfg.Raft != nil {
		ectx, cancel := context.WithTimeout(ctx, timeout)
		err := l.cfg.Raft.EnsureLeader(ectx)
		cancel()
		if err != nil {
			// As etcd answers: the client moves to another member.
			return 0, ErrNotPrimary
		}
	}
	l.mu.Lock()
	le, err := l.renewableLocked(id)
	if err != nil {
		l.mu.Unlock()
		return 0, err
	}
	clear := le.remaining > 0
	l.mu.Unlock()
	if clear && l.cfg.Proposer != nil {
		req := &pb.InternalRaftRequest{LeaseCheckpoint: &pb.LeaseCheckpointRequest{
			Checkpoints: []*pb.LeaseCheckpoint{{ID: id, Remaining_TTL: 0}},
		}}
		sctx, cancel := context.WithTimeout(ctx, timeout)
		err := l.cfg.Proposer.Submit(sctx, req)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("renew lease %x: clear its checkpoint: %w", id, err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if le, err = l.renewableLocked(id); err != nil {
		return 0, err
	}
	le.expiry = l.clock.Now().Add(time.Duration(le.ttl) * time.Second)
	le.due = le.expiry
	heap.Fix(&l.mu.heap, le.index)
	return le.ttl, nil
}

// renewableLocked returns lease id if the primary may renew it.
//
// REQUIRES: l.mu held.
func (l *Lessor) renewableLocked(id int64) (*lease, error) {
	if !l.mu.primary {
		return nil, ErrNotPrimary
	}
	le, ok := l.mu.leases[id]
	if !ok || !l.clock.Now().Before(le.expiry) {
		return nil, ErrLeaseNotFound
	}
	return le, nil
}

// TimeToLive returns lease id's remaining and granted TTL, in seconds.
// Only the primary knows the remaining TTL (ErrNotPrimary otherwise).
func (l *Lessor) TimeToLive(id int64) (remaining, granted int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.mu.primary {
		return 0, 0, ErrNotPrimary
	}
	le, ok := l.mu.leases[id]
	if !ok {
		return 0, 0, ErrLeaseNotFound
	}
	left := le.expiry.Sub(l.clock.Now())
	return max(int64(left.Seconds()), 0), le.ttl, nil
}

// Leases returns the IDs of every lease, in ascending order.
func (l *Lessor) Leases() []int64 {
	l.mu.Lock()
	ids := make([]int64, 0, len(l.mu.leases))
	for id := range l.mu.leases {
		ids = append(ids, id)
	}
	l.mu.Unlock()
	slices.Sort(ids)
	return ids
}

// Primary reports whether the lessor is promoted (tracks deadlines).
func (l *Lessor) Primary() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.primary
}

// Promote makes the lessor primary: every lease's deadline becomes now +
// its checkpointed remaining TTL (or its TTL) + extend.
func (l *Lessor) Promote(extend time.Duration) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.primary {
		return
	}
	l.mu.primary = true
	l.mu.lastCheckpoint = now
	l.mu.heap = make(dueHeap, 0, len(l.mu.leases))
	for _, le := range l.mu.leases {
		l.startLocked(le, now, extend)
	}
}

// Demote makes the lessor a follower's: it forgets every deadline.
func (l *Lessor) Demote() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.primary = false
	for _, le := range l.mu.heap {
		le.index = -1
	}
	l.mu.heap = nil
}

// startLocked gives le a deadline counted from its checkpoint (or its TTL)
// and puts it in the heap.
//
// REQUIRES: l.mu held, l.mu.primary.
func (l *Lessor) startLocked(le *lease, now time.Time, extend time.Duration) {
	left := le.ttl
	if le.remaining > 0 && le.remaining < le.ttl {
		left = le.remaining
	}
	le.expiry = now.Add(time.Duration(left)*time.Second + extend)
	le.due = le.expiry
	heap.Push(&l.mu.heap, le)
}

// expired returns up to n leases due for a revoke at now and pushes their
// next look to now + revokeRetry, so that each is proposed once per retry
// interval until its revoke applies.
// anyExpired reports whether a lease is due for its revoke at now.
func (l *Lessor) anyExpired(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.mu.heap) > 0 && !l.mu.heap[0].due.After(now)
}

func (l *Lessor) expired(now time.Time, n int) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ids []int64
	for len(ids) < n && len(l.mu.heap) > 0 {
		le := l.mu.heap[0]
		if le.due.After(now) {
			break
		}
		ids = append(ids, le.id)
		le.due = now.Add(revokeRetry)
		heap.Fix(&l.mu.heap, 0)
	}
	return ids
}

// checkpoints returns, in batches, the remaining TTL of every lease that
// has run down below its TTL and whose remaining TTL differs from the one
// recorded, if a checkpoint is due at now.
func (l *Lessor) checkpoints(now time.Time) [][]*pb.LeaseCheckpoint {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.mu.primary || l.cfg.CheckpointInterval < 0 || now.Sub(l.mu.lastCheckpoint) < l.cfg.CheckpointInterval {
		return nil
	}
	l.mu.lastCheckpoint = now
	var all []*pb.LeaseCheckpoint
	for _, le := range l.mu.heap {
		left := int64(math.Ceil(le.expiry.Sub(now).Seconds()))
		if left >= le.ttl || left <= 0 || left == le.remaining {
			continue
		}
		all = append(all, &pb.LeaseCheckpoint{ID: le.id, Remaining_TTL: left})
	}
	slices.SortFunc(all, func(a, b *pb.LeaseCheckpoint) int { return compareID(a.ID, b.ID) })
	var out [][]*pb.LeaseCheckpoint
	for len(all) > 0 {
		n := min(len(all), maxCheckpointBatch)
		out = append(out, all[:n])
		all = all[n:]
	}
	return out
}

func compareID(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Run follows the member's leadership and, while leader, revokes expired
// leases and checkpoints remaining TTLs, until ctx ends.
func (l *Lessor) Run(ctx context.Context) {
	t := time.NewTicker(l.cfg.Tick)
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.step(ctx, &wg)
	}
}

// step is one tick of Run: promote or demote, then propose revokes of
// expired leases and due checkpoints, each on its own goroutine counted
// in wg so that a slow proposal does not hold up the next tick.
func (l *Lessor) step(ctx context.Context, wg *sync.WaitGroup) {
	leader := l.cfg.Raft != nil && l.cfg.Raft.IsLeader()
	switch primary := l.Primary(); {
	case leader && !primary:
		if !l.caughtUp() {
			return
		}
		l.Promote(l.cfg.ElectionTimeout)
		l.lg.Info("lessor promoted", zap.Duration("extend", l.cfg.ElectionTimeout))
	case !leader && primary:
		l.Demote()
		l.lg.Info("lessor demoted")
	}
	if !leader {
		l.promoteAt = 0
		return
	}
	if l.cfg.Proposer == nil {
		return
	}
	now := l.clock.Now()
	if l.anyExpired(now) {
		cctx, cancel := context.WithTimeout(ctx, revokeRetry)
		err := l.cfg.Raft.ConfirmLeader(cctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				l.lg.Warn("expired leases not revoked: leadership not confirmed", zap.Error(err))
			}
			return
		}
	}
	for _, id := range l.expired(now, maxRevokesPerTick) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, revokeRetry)
			defer cancel()
			err := l.cfg.Proposer.Submit(pctx, &pb.InternalRaftRequest{LeaseRevoke: &pb.LeaseRevokeRequest{ID: id}})
			if err != nil && !errors.Is(err, ErrLeaseNotFound) && ctx.Err() == nil {
				l.lg.Warn("revoke of expired lease failed; will retry", zap.Int64("lease", id), zap.Error(err))
			}
		}()
	}
	for _, batch := range l.checkpoints(now) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, revokeRetry)
			defer cancel()
			err := l.cfg.Proposer.Submit(pctx, &pb.InternalRaftRequest{LeaseCheckpoint: &pb.LeaseCheckpointRequest{Checkpoints: batch}})
			if err != nil && ctx.Err() == nil {
				l.lg.Warn("lease checkpoint failed", zap.Int("leases", len(batch)), zap.Error(err))
			}
		}()
	}
}

// caughtUp reports whether a leader has applied its log as it was when it
// first looked, so that its lessor may be promoted.
func (l *Lessor) caughtUp() bool {
	if l.promoteAt == 0 {
		l.promoteAt = max(l.cfg.Raft.LastIndex(), 1)
	}
	if l.cfg.Raft.AppliedIndex() < l.promoteAt {
		return false
	}
	l.promoteAt = 0
	return true
}

// dueHeap orders leases by due time, earliest first.
type dueHeap []*lease

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

func (h *dueHeap) Push(x any) {
	le := x.(*lease)
	le.index = len(*h)
	*h = append(*h, le)
}

func (h *dueHeap) Pop() any {
	old := *h
	n := len(old)
	le := old[n-1]
	old[n-1] = nil
	le.index = -1
	*h = old[:n-1]
	return le
}
