// Package apply is the only path by which committed raft entries change
// strata's state. The applier takes batches of committed entries from the
// node, applies every request of every entry it has at hand to one mvcc write
// batch, commits that batch to the engine together with the index of the last
// entry (DESIGN.md rule 2: one applier, one batch, the applied index in the
// same batch as the data), and only then answers the clients that wait on
// those entries and reports progress to the node.
//
// There is no "consistent index" kept on the side and no per-entry decision
// about whether an entry was already applied: raft redelivers exactly the
// entries after the engine's applied index, and each is applied once.
//
// Concurrency: Run is the applier goroutine, the only writer to mvcc.
// Register, AppliedIndex, WaitApplied and Members are safe from any
// goroutine.
package apply

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/internal/failpoint"
	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/node"
)

// Meta names under which the applier keeps replicated cluster state in the
// engine, in the same batch as the entries that change it.
const (
	metaConfState = "raft/confstate"
	metaMembers   = "cluster/members"
)

// Result is the outcome of one applied request: the response proto (a
// *pb.PutResponse, *pb.DeleteRangeResponse, *pb.TxnResponse or
// *pb.CompactionResponse) or the error the state machine returned.
type Result struct {
	Response proto.Message
	Err      error
	// Compacted, for a compaction, closes when the physical removal of the
	// compacted revisions has finished.
	Compacted <-chan struct{}
}

// Progress receives the applied index after each engine commit.
type Progress interface {
	Applied(index uint64)
}

// Applier applies committed entries. See the package comment.
type Applier struct {
	store    *mvcc.Store
	progress Progress
	logger   *zap.Logger

	applied atomic.Uint64

	mu struct {
		sync.Mutex
		waiters   map[uint64]chan Result // request ID -> waiting client
		appliedCh chan struct{}          // closed and replaced on every commit
	}
	members   atomic.Pointer[[]*pb.Member]
	confState atomic.Pointer[raftpb.ConfState]
	alarms    atomic.Pointer[[]*pb.AlarmMember] // see alarm.go

	// Set before Run, read only by the applier goroutine.
	install          func(snap *raftpb.Snapshot) error
	onMembersChanged func(members []*pb.Member)
	lessor           *lease.Lessor // nil: lease requests are refused
	auth             Auth          // nil: auth requests are refused

	// onCommit is told after every engine commit (the watch hub's Notify);
	// set before Run.
	onCommit func()
}

// New creates an applier over store, whose state it reads back: the applied
// index, the raft conf state and the membership.
func New(store *mvcc.Store, progress Progress, logger *zap.Logger) (*Applier, error) {
	if logger == nil {
		logger = zap.NewNop()
	}
	a := &Applier{store: store, progress: progress, logger: logger}
	a.mu.waiters = map[uint64]chan Result{}
	a.mu.appliedCh = make(chan struct{})
	if err := a.load(); err != nil {
		return nil, err
	}
	return a, nil
}

// load reads the applied index, membership and conf state back from the
// store: at start-up, and after a snapshot replaced the store's content.
func (a *Applier) load() error {
	store := a.store
	a.applied.Store(store.AppliedIndex())
	members := []*pb.Member{}
	if raw, err := store.Meta(metaMembers); err != nil {
		return fmt.Errorf("read membership: %w", err)
	} else if raw != nil {
		var list pb.MemberListResponse
		if err := proto.Unmarshal(raw, &list); err != nil {
			return fmt.Errorf("decode membership: %w", err)
		}
		members = list.Members
	}
	a.members.Store(&members)
	if raw, err := store.Meta(metaConfState); err != nil {
		return fmt.Errorf("read conf state: %w", err)
	} else if raw != nil {
		var cs raftpb.ConfState
		if err := proto.Unmarshal(raw, &cs); err != nil {
			return fmt.Errorf("decode conf state: %w", err)
		}
		a.confState.Store(&cs)
	}
	return a.loadAlarms()
}

// SetProgress sets the receiver of applied-index reports. It must be called
// before Run.
func (a *Applier) SetProgress(p Progress) { a.progress = p }

// SetInstaller sets the function that replaces the store's content with a
// received snapshot. It must be called before Run.
func (a *Applier) SetInstaller(install func(snap *raftpb.Snapshot) error) { a.install = install }

// SetMembersChanged sets a function called, on the applier goroutine,
// with the new member list after every applied membership change. It must
// be called before Run.
func (a *Applier) SetMembersChanged(f func(members []*pb.Member)) { a.onMembersChanged = f }

// SetOnCommit sets a function called on the applier goroutine after every
// engine commit and snapshot install, once the new state is readable (the
// watch hub's Notify). It must not block. It must be called before Run.
func (a *Applier) SetOnCommit(f func()) { a.onCommit = f }

// SetLessor sets the lessor that applies lease requests. It must be called
// before Run.
func (a *Applier) SetLessor(l *lease.Lessor) { a.lessor = l }

// ConfState returns the raft membership the state machine holds, or nil
// before the first membership entry was applied.
func (a *Applier) ConfState() *raftpb.ConfState { return a.confState.Load() }

// Members returns the cluster's members, sorted by ID.
func (a *Applier) Members() []*pb.Member { return *a.members.Load() }

// AppliedIndex returns the index of the last entry committed to the engine.
func (a *Applier) AppliedIndex() uint64 { return a.applied.Load() }

// Register returns the channel on which the result of the request with
// this ID will be delivered once applied. Call it before proposing.
func (a *Applier) Register(id uint64) <-chan Result {
	c := make(chan Result, 1)
	a.mu.Lock()
	a.mu.waiters[id] = c
	a.mu.Unlock()
	return c
}

// Cancel forgets a registered request whose client gave up.
func (a *Applier) Cancel(id uint64) {
	a.mu.Lock()
	delete(a.mu.waiters, id)
	a.mu.Unlock()
}

// WaitApplied blocks until every entry up to index has been applied.
func (a *Applier) WaitApplied(ctx context.Context, index uint64) error {
	for {
		a.mu.Lock()
		ch := a.mu.appliedCh
		a.mu.Unlock()
		if a.applied.Load() >= index {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Run applies batches from in until it is closed or ctx ends. An error
// from the engine is returned and is fatal.
func (a *Applier) Run(ctx context.Context, in <-chan node.Committed) error {
	for {
		var first node.Committed
		select {
		case first = <-in:
		case <-ctx.Done():
			return nil
		}
		if first.Snapshot != nil {
			if err := a.installSnapshot(first); err != nil {
				return err
			}
			continue
		}
		// Take whatever else is queued: one engine batch for all of it. A
		// snapshot ends the run; it is installed after the batch commits.
		batches := []node.Committed{first}
		var snapshot *node.Committed
	drain:
		for len(batches) < 64 {
			select {
			case c := <-in:
				if c.Snapshot != nil {
					snapshot = &c
					break drain
				}
				batches = append(batches, c)
			default:
				break drain
			}
		}
		if err := a.applyBatches(batches); err != nil {
			return err
		}
		if snapshot != nil {
			if err := a.installSnapshot(*snapshot); err != nil {
				return err
			}
		}
	}
}

// ErrOutcomeUnknown answers a request whose entry a snapshot install may
// have covered: the install brings the entry's effect (a full snapshot
// holds the leader's state, an incremental one folds most entries into key
// records), but not its response, so whether and how it was applied is
// not known here. The server answers it as etcd answers a request whose
// outcome it cannot tell ("etcdserver: request timed out").
var ErrOutcomeUnknown = errors.New("apply: a snapshot install covered the request; its outcome is unknown")

// installSnapshot replaces the store's content with a received snapshot
// and reloads what the applier keeps of it. A failure is reported to the
// node, which treats it as fatal.
//
// The clients waiting when the install starts get their answer at once:
// those the install applied through the request path (an incremental
// install's entries after its batches) get their result, every other one
// ErrOutcomeUnknown. Without this they waited until their deadline for an
// answer that never came (issue 10 finding 7): the entries an install
// covers are never applied through the request path, and those redelivered
// after it are skipped as already applied. A waiting client whose entry
// comes after the snapshot's engine view also gets ErrOutcomeUnknown,
// although its entry will apply: as in etcd, a timeout does not say the
// request failed. Clients registered after the install started are left
// waiting: they proposed after the snapshot reached this member, so after
// the leader took the snapshot's engine view, and their entries are
// applied as usual.
func (a *Applier) installSnapshot(c node.Committed) error {
	a.mu.Lock()
	waiting := make([]uint64, 0, len(a.mu.waiters))
	for id := range a.mu.waiters {
		waiting = append(waiting, id)
	}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		for _, id := range waiting {
			if ch, ok := a.mu.waiters[id]; ok {
				ch <- Result{Err: ErrOutcomeUnknown}
				delete(a.mu.waiters, id)
			}
		}
		a.mu.Unlock()
	}()
	var err error
	if a.install == nil {
		err = fmt.Errorf("no snapshot installer")
	} else if err = a.install(c.Snapshot); err == nil {
		err = a.load()
	}
	if err == nil {
		a.mu.Lock()
		close(a.mu.appliedCh)
		a.mu.appliedCh = make(chan struct{})
		a.mu.Unlock()
		if a.onMembersChanged != nil {
			a.onMembersChanged(a.Members())
		}
		if a.progress != nil {
			a.progress.Applied(a.applied.Load())
		}
		if a.onCommit != nil {
			a.onCommit()
		}
	}
	c.Installed <- err
	return err
}

type answer struct {
	id     uint64
	result Result
}

func (a *Applier) applyBatches(batches []node.Committed) error {
	w := a.store.Write()
	var answers []answer
	var last uint64
	membersChanged := false
	// A private copy: readers hold the published slice.
	members := append([]*pb.Member(nil), a.Members()...)
	var confState *raftpb.ConfState
	// An engine that applied entries but holds no conf state lost it; the
	// node then has raft redeliver the log from its snapshot point
	// (node.raftAppliedIndex), and the membership entries among what the
	// engine already holds bring it back (the member list too, if that was
	// lost with it).
	repairConf := a.confState.Load() == nil && a.applied.Load() > 0
	repairMembers := repairConf && len(members) == 0
	for _, c := range batches {
		for _, e := range c.Entries {
			last = e.GetIndex()
			if last <= a.applied.Load() {
				// Redelivered: already in the engine.
				if cs := c.ConfStates[last]; cs != nil && repairConf {
					confState = cs
					if repairMembers {
						if _, _, err := applyConfChange(e, &members); err != nil {
							w.Abort()
							return fmt.Errorf("reapply conf change %d: %w", last, err)
						}
						membersChanged = true
					}
				}
				continue
			}
			switch e.GetType() {
			case raftpb.EntryNormal:
				if len(e.GetData()) == 0 {
					continue // a new leader's empty entry
				}
				var req pb.InternalRaftRequest
				if err := proto.Unmarshal(e.GetData(), &req); err != nil {
					w.Abort()
					return fmt.Errorf("decode entry %d: %w", e.GetIndex(), err)
				}
				revBefore := w.Rev()
				res, changed, err := a.applyRequest(w, &req, &members)
				if err == nil {
					err = w.RecordIndex(e.GetIndex(), revBefore) // for log compaction (logcompact.go)
				}
				if err != nil {
					w.Abort()
					return fmt.Errorf("apply entry %d: %w", e.GetIndex(), err)
				}
				membersChanged = membersChanged || changed
				if id := requestID(&req); id != 0 {
					answers = append(answers, answer{id: id, result: res})
				}
			case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
				cs := c.ConfStates[e.GetIndex()]
				if cs != nil {
					confState = cs
				}
				id, changed, err := applyConfChange(e, &members)
				if err != nil {
					w.Abort()
					return fmt.Errorf("apply conf change %d: %w", e.GetIndex(), err)
				}
				membersChanged = membersChanged || changed
				if id != 0 {
					answers = append(answers, answer{id: id})
				}
			}
		}
	}
	if last <= a.applied.Load() {
		if confState == nil && !membersChanged {
			w.Abort()
			return nil
		}
		// Only the lost conf state comes back: commit it at the index the
		// engine holds.
		last = a.applied.Load()
	}
	if confState != nil {
		raw, err := proto.Marshal(confState)
		if err != nil {
			w.Abort()
			return fmt.Errorf("encode conf state: %w", err)
		}
		if err := w.SetMeta(metaConfState, raw); err != nil {
			w.Abort()
			return err
		}
	}
	if membersChanged {
		raw, err := proto.Marshal(&pb.MemberListResponse{Members: members})
		if err != nil {
			w.Abort()
			return fmt.Errorf("encode membership: %w", err)
		}
		if err := w.SetMeta(metaMembers, raw); err != nil {
			w.Abort()
			return err
		}
	}
	if err := w.Commit(last); err != nil {
		return fmt.Errorf("commit applied batch up to %d: %w", last, err)
	}
	failpoint.Hit("apply/after-commit")
	// Visible from here on: publish, then answer the waiting clients.
	if confState != nil {
		a.confState.Store(confState)
	}
	if membersChanged {
		a.members.Store(&members)
	}
	a.applied.Store(last)
	if a.onCommit != nil {
		a.onCommit()
	}
	a.mu.Lock()
	close(a.mu.appliedCh)
	a.mu.appliedCh = make(chan struct{})
	for _, ans := range answers {
		if c, ok := a.mu.waiters[ans.id]; ok {
			c <- ans.result
			delete(a.mu.waiters, ans.id)
		}
	}
	a.mu.Unlock()
	// After the answers: a member that applied its own removal stops on
	// this call, and the client that asked for the removal must have its
	// answer first.
	if membersChanged && a.onMembersChanged != nil {
		a.onMembersChanged(members)
	}
	if a.progress != nil {
		a.progress.Applied(last)
	}
	return nil
}

func requestID(r *pb.InternalRaftRequest) uint64 {
	if r.Header != nil && r.Header.ID != 0 {
		return r.Header.ID
	}
	return r.ID
}

// applyRequest applies one client request. A request the state machine
// refuses (a compacted revision, a missing lease) is a Result with an
// error, not a failure of the applier: every member refuses it the same way.
func (a *Applier) applyRequest(w *mvcc.WriteBatch, r *pb.InternalRaftRequest, members *[]*pb.Member) (Result, bool, error) {
	if err := a.refusedByAlarm(r); err != nil {
		return Result{Err: err}, false, nil
	}
	if a.auth != nil {
		if res, handled, err := a.auth.Apply(w, r); handled || err != nil {
			return res, false, err
		}
	}
	switch {
	case r.Alarm != nil:
		res, err := a.applyAlarm(w, r.Alarm)
		return res, false, err
	case r.Put != nil:
		resp, err := w.Put(r.Put)
		return Result{Response: resp, Err: err}, false, nil
	case r.DeleteRange != nil:
		resp, err := w.DeleteRange(r.DeleteRange)
		return Result{Response: resp, Err: err}, false, nil
	case r.Txn != nil:
		resp, err := w.Txn(r.Txn)
		return Result{Response: resp, Err: err}, false, nil
	case r.Compaction != nil:
		resp, done, err := w.Compact(r.Compaction)
		return Result{Response: resp, Err: err, Compacted: done}, false, nil
	case r.LeaseGrant != nil && a.lessor != nil:
		resp, err := a.lessor.Grant(w, r.LeaseGrant)
		return Result{Response: resp, Err: err}, false, nil
	case r.LeaseRevoke != nil && a.lessor != nil:
		resp, err := a.lessor.Revoke(w, r.LeaseRevoke)
		return Result{Response: resp, Err: err}, false, nil
	case r.LeaseCheckpoint != nil && a.lessor != nil:
		resp, err := a.lessor.Checkpoint(w, r.LeaseCheckpoint)
		return Result{Response: resp, Err: err}, false, nil
	case r.ClusterMemberAttrSet != nil:
		set := r.ClusterMemberAttrSet
		changed := false
		for i, m := range *members {
			if m.ID == set.Member_ID && set.MemberAttributes != nil {
				m = proto.CloneOf(m)
				m.Name = set.MemberAttributes.Name
				m.ClientURLs = set.MemberAttributes.ClientUrls
				(*members)[i] = m
				changed = true
			}
		}
		return Result{Response: &pb.MemberUpdateResponse{}}, changed, nil
	default:
		// A request kind this version does not know: refuse it the same
		// way on every member rather than stop applying.
		return Result{Err: ErrUnsupportedRequest}, false, nil
	}
}

// ErrUnsupportedRequest answers a replicated request of a kind this
// version does not apply.
var ErrUnsupportedRequest = fmt.Errorf("apply: unsupported request")

// applyConfChange updates the member list for a committed membership
// change. The change's context carries the member (as etcd does); a
// version-1 change carries the ID of the request that waits for it.
func applyConfChange(e *raftpb.Entry, members *[]*pb.Member) (requestID uint64, changed bool, err error) {
	var changes []*raftpb.ConfChangeSingle
	var context []byte
	switch e.GetType() {
	case raftpb.EntryConfChange:
		var cc raftpb.ConfChange
		if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
			return 0, false, err
		}
		changes = cc.AsV2().GetChanges()
		context = cc.GetContext()
		requestID = cc.GetId()
	default:
		var cc raftpb.ConfChangeV2
		if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
			return 0, false, err
		}
		changes = cc.GetChanges()
		context = cc.GetContext()
	}
	var m pb.Member
	if len(context) > 0 {
		if err := proto.Unmarshal(context, &m); err != nil {
			return 0, false, fmt.Errorf("decode member in conf change: %w", err)
		}
	}
	for _, ch := range changes {
		id := ch.GetNodeId()
		switch ch.GetType() {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			learner := ch.GetType() == raftpb.ConfChangeAddLearnerNode
			found := false
			for i, old := range *members {
				if old.ID == id {
					nm := proto.CloneOf(old)
					nm.IsLearner = learner
					(*members)[i] = nm
					found = true
				}
			}
			if !found {
				nm := proto.CloneOf(&m)
				nm.ID = id
				nm.IsLearner = learner
				*members = insertSorted(*members, nm)
			}
			changed = true
		case raftpb.ConfChangeRemoveNode:
			out := (*members)[:0:0]
			for _, old := range *members {
				if old.ID != id {
					out = append(out, old)
				}
			}
			*members = out
			changed = true
		case raftpb.ConfChangeUpdateNode:
			for i, old := range *members {
				if old.ID == id && len(context) > 0 {
					nm := proto.CloneOf(old)
					nm.PeerURLs = m.PeerURLs
					(*members)[i] = nm
					changed = true
				}
			}
		}
	}
	return requestID, changed, nil
}

func insertSorted(members []*pb.Member, m *pb.Member) []*pb.Member {
	out := make([]*pb.Member, 0, len(members)+1)
	placed := false
	for _, old := range members {
		if !placed && m.ID < old.ID {
			out = append(out, m)
			placed = true
		}
		out = append(out, old)
	}
	if !placed {
		out = append(out, m)
	}
	return out
}
