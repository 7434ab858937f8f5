// Package apply is the only path by which committed raft entries change
// strata's state. The applier takes batches of committed entries from the
// node, applies every request of every entry it has at hand to one mvcc write
// batch, commits that batch to the engine together with the index of the last
// entry (docs/design.md, durability rule 2: the applied index in the same
// batch as the data), and only then answers the clients that wait on those
// entries (Waiters), tells the node the applied index (Progress), and
// reports the outcome (a changed membership) on Outcomes, which the
// member's one loop hands to the transport.
//
// There is no "consistent index" kept on the side and no per-entry decision
// about whether an entry was already applied: raft redelivers exactly the
// entries after the engine's applied index, and each is applied once.
//
// The applier is built once from a Config that holds everything it works
// with: the store, the lessor and the auth store (state-machine state it
// applies requests to and reloads after a snapshot install), the installer
// that replaces the store's content for a snapshot, the waiters, and the
// notifier told after every commit (the watch hub). Nothing is attached
// later.
//
// Concurrency: Run is the applier goroutine, the only one that applies
// entries. Others commit to the store too: start-up recovery
// (ReplayRun, before Run starts), MVCC's physical compaction
// (removing revisions a compaction entry made unreachable, in the
// background), and the log compactor, which writes only the store's index
// -> revision bookkeeping (mvcc.ForgetIndexRevisions); none of them changes
// what a read at a live revision returns.
// AppliedIndex, WaitApplied, Members, ConfState and Alarms are safe from any
// goroutine.
package apply

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/engine"
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

// Installer stages the data of raft snapshots and installs it (package
// snapshot's Snapshotter). Both methods run on the applier goroutine.
type Installer interface {
	// Install makes the store hold the state of snap: it replaces the
	// store's content with a staged full snapshot and returns nil, or
	// returns the catch-up of a staged incremental one, which the applier
	// applies (InstallCatchUp).
	Install(snap *raftpb.Snapshot) (*CatchUp, error)
	// Durable makes the state an applied catch-up reached at index
	// durable, before the node restarts the log after the snapshot.
	Durable(index uint64) error
}

// Notifier is told, on the applier goroutine, after every engine commit and
// snapshot install, once the new state is readable (the watch hub). Notify
// must not block.
type Notifier interface {
	Notify()
}

// Progress receives the applied index after each engine commit and
// snapshot install (the node, which flushes the engine and truncates the
// log from it). Applied must not block.
type Progress interface {
	Applied(index uint64)
}

// Config is everything an applier works with, given once at construction.
type Config struct {
	// Progress, if not nil, is told the applied index after every commit
	// and install, on the applier goroutine, as soon as the engine holds
	// it.
	Progress Progress
	// Store is the state machine the applier writes; its content says
	// where the applier starts (applied index, conf state, membership).
	Store *mvcc.Store
	// Waiters is where clients wait for the results of their requests;
	// nil gives the applier a registry of its own (recovery, tests).
	Waiters *Waiters
	// Lessor applies lease requests; nil refuses them (and recovery
	// replays kept lease entries as records, see replay.go).
	Lessor *lease.Lessor
	// Auth holds users and roles: auth requests are applied to it and
	// users' writes checked against it (auth.go); nil refuses auth
	// requests as unsupported.
	Auth *auth.Store
	// Alarms is where the applier publishes the raised alarms; nil gives
	// it a list of its own.
	Alarms *Alarms
	// Installer installs raft snapshots; nil fails an install.
	Installer Installer
	// Notifier, if not nil, is told after every commit and install.
	Notifier Notifier
	// MaxLearners is --max-learners, the limit on learners a membership
	// change is checked against when it applies (memberlist; 0: etcd's
	// default).
	MaxLearners int
	// WarnApplyDuration is etcd's --warning-apply-duration: a request
	// whose apply takes longer is logged as etcd logs it ("apply request
	// took too long"). 0: etcd's 100ms.
	WarnApplyDuration time.Duration
	Logger            *zap.Logger
}

// Outcome is what one engine commit or snapshot install did that the
// member acts on: the index now applied, and the member list when it
// changed. Run reports one per commit or install, after the waiting clients
// have their answers (see Outcomes).
type Outcome struct {
	// Applied is the index the engine holds now.
	Applied uint64
	// Members is the new member list; nil if the membership did not change.
	Members []*pb.Member
	// Removed holds the IDs removed from the cluster, given with Members:
	// a member learns its own removal from it (membership.Tracker).
	Removed []uint64
	// Installed is set when the outcome is a snapshot install's.
	Installed bool
}

// Applier applies committed entries. See the package comment.
type Applier struct {
	cfg    Config
	store  *mvcc.Store
	lessor *lease.Lessor
	logger *zap.Logger
	// auth is cfg.Auth as the request path uses it (auth.go); nil when
	// cfg.Auth is.
	auth *authApplier

	applied atomic.Uint64

	mu struct {
		sync.Mutex
		appliedCh chan struct{} // closed and replaced on every commit
	}
	members   atomic.Pointer[[]*pb.Member]
	confState atomic.Pointer[raftpb.ConfState]
	// removed and refused are the removed members' IDs and the refused
	// membership entries' indexes (members.go), read and replaced on the
	// applier goroutine only.
	removed, refused []uint64
	alarms           *Alarms // cfg.Alarms, or the applier's own; see alarm.go

	outcomes chan Outcome

	// runDone is closed when Run returns, after runErr is set to what it
	// returned: waits for an index Run will never reach end then.
	runDone chan struct{}
	runErr  error
}

// ErrStopped is WaitApplied's answer once Run has returned without an
// error (its context ended) short of the index asked for.
var ErrStopped = errors.New("apply: the applier stopped")

// New creates an applier over cfg.Store, whose state it reads back: the
// applied index, the raft conf state and the membership.
func New(cfg Config) (*Applier, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Waiters == nil {
		cfg.Waiters = NewWaiters()
	}
	if cfg.Alarms == nil {
		cfg.Alarms = &Alarms{}
	}
	if cfg.WarnApplyDuration <= 0 {
		cfg.WarnApplyDuration = 100 * time.Millisecond
	}
	a := &Applier{cfg: cfg, store: cfg.Store, lessor: cfg.Lessor, alarms: cfg.Alarms, logger: cfg.Logger,
		outcomes: make(chan Outcome, 1), runDone: make(chan struct{})}
	if cfg.Auth != nil {
		a.auth = &authApplier{s: cfg.Auth}
	}
	a.mu.appliedCh = make(chan struct{})
	if err := a.load(); err != nil {
		return nil, err
	}
	return a, nil
}

// ClusterState is the replicated cluster state the applier keeps in the
// engine beside the key space: the member list, raft's conf state at the
// applied index, and the raised alarms.
type ClusterState struct {
	Members []*pb.Member
	// Removed holds the IDs of the members removed, sorted.
	Removed   []uint64
	ConfState *raftpb.ConfState // nil before the first membership entry
	Alarms    []*pb.AlarmMember
}

// ReadClusterState reads the cluster state r (the store's engine, or a
// consistent view of it) holds.
func ReadClusterState(r engine.Reader) (ClusterState, error) {
	st := ClusterState{Members: []*pb.Member{}, Alarms: []*pb.AlarmMember{}}
	if raw, err := mvcc.ReadMeta(r, metaMembers); err != nil {
		return ClusterState{}, fmt.Errorf("read membership: %w", err)
	} else if raw != nil {
		var list pb.MemberListResponse
		if err := proto.Unmarshal(raw, &list); err != nil {
			return ClusterState{}, fmt.Errorf("decode membership: %w", err)
		}
		st.Members = list.Members
	}
	if raw, err := mvcc.ReadMeta(r, metaRemoved); err != nil {
		return ClusterState{}, fmt.Errorf("read removed members: %w", err)
	} else if st.Removed, err = decodeUint64s(raw); err != nil {
		return ClusterState{}, fmt.Errorf("decode removed members: %w", err)
	}
	if raw, err := mvcc.ReadMeta(r, metaConfState); err != nil {
		return ClusterState{}, fmt.Errorf("read conf state: %w", err)
	} else if raw != nil {
		st.ConfState = &raftpb.ConfState{}
		if err := proto.Unmarshal(raw, st.ConfState); err != nil {
			return ClusterState{}, fmt.Errorf("decode conf state: %w", err)
		}
	}
	if raw, err := mvcc.ReadMeta(r, metaAlarms); err != nil {
		return ClusterState{}, fmt.Errorf("read alarms: %w", err)
	} else if raw != nil {
		var resp pb.AlarmResponse
		if err := proto.Unmarshal(raw, &resp); err != nil {
			return ClusterState{}, fmt.Errorf("decode alarms: %w", err)
		}
		st.Alarms = resp.Alarms
	}
	return st, nil
}

// load reads the applied index, membership, conf state and alarms back
// from the store: at start-up, and after a snapshot replaced the store's
// content.
func (a *Applier) load() error {
	a.applied.Store(a.store.AppliedIndex())
	st, err := ReadClusterState(a.store.Reader())
	if err != nil {
		return err
	}
	a.members.Store(&st.Members)
	a.removed = st.Removed
	refused, err := mvcc.ReadMeta(a.store.Reader(), metaRefused)
	if err != nil {
		return fmt.Errorf("read refused membership changes: %w", err)
	}
	if a.refused, err = decodeUint64s(refused); err != nil {
		return fmt.Errorf("decode refused membership changes: %w", err)
	}
	if st.ConfState != nil {
		a.confState.Store(st.ConfState)
	}
	a.alarms.list.Store(&st.Alarms)
	return nil
}

// Outcomes delivers what the commits and installs did. Outcomes not yet
// taken are merged into one (the newest applied index, the newest member
// list), so the applier never waits for the member's loop and the loop
// always acts on the newest state: the transport needs only the newest
// membership.
func (a *Applier) Outcomes() <-chan Outcome { return a.outcomes }

// report publishes o, merged with an outcome still waiting to be taken.
// Only the applier goroutine reports, so after the receive below the
// channel (capacity 1) has room.
func (a *Applier) report(o Outcome) {
	select {
	case waiting := <-a.outcomes:
		if o.Members == nil {
			o.Members, o.Removed = waiting.Members, waiting.Removed
		}
		o.Installed = o.Installed || waiting.Installed
	default:
	}
	a.outcomes <- o
}

// ConfState returns the raft membership the state machine holds, or nil
// before the first membership entry was applied.
func (a *Applier) ConfState() *raftpb.ConfState { return a.confState.Load() }

// Members returns the cluster's members, sorted by ID.
func (a *Applier) Members() []*pb.Member { return *a.members.Load() }

// Removed returns the IDs of the members removed from the cluster, sorted.
// Only the goroutine that runs Run, or one that calls it before Run starts,
// may call it.
func (a *Applier) Removed() []uint64 { return a.removed }

// AppliedIndex returns the index of the last entry committed to the engine.
func (a *Applier) AppliedIndex() uint64 { return a.applied.Load() }

// WaitApplied blocks until every entry up to index has been applied, ctx
// ends, or Run has returned short of it (then Run's error, or ErrStopped).
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
		case <-a.runDone:
			if a.applied.Load() >= index {
				return nil
			}
			if a.runErr != nil {
				return fmt.Errorf("apply: the applier failed: %w", a.runErr)
			}
			return ErrStopped
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Run applies batches from in until it is closed or ctx ends. An error
// from the engine is returned and is fatal. Run is called once.
func (a *Applier) Run(ctx context.Context, in <-chan node.Committed) (err error) {
	defer func() {
		a.runErr = err
		close(a.runDone)
	}()
	for {
		var first node.Committed
		select {
		case first = <-in:
		case <-ctx.Done():
			return nil
		}
		if first.Snapshot != nil || first.Decide != nil {
			if err := a.special(first); err != nil {
				return err
			}
			continue
		}
		// Take whatever else is queued, up to maxBatchBytes of entries: one
		// engine batch for it (more than one if first alone is larger). A
		// snapshot or a membership decision ends the run; it is handled
		// after the batches commit.
		batches := []node.Committed{first}
		size := entryBytes(first.Entries)
		var last *node.Committed
	drain:
		for len(batches) < 64 && size < maxBatchBytes {
			select {
			case c := <-in:
				if c.Snapshot != nil || c.Decide != nil {
					last = &c
					break drain
				}
				batches = append(batches, c)
				size += entryBytes(c.Entries)
			default:
				break drain
			}
		}
		for _, piece := range pieces(batches, maxBatchBytes) {
			if err := a.applyBatches(piece); err != nil {
				return err
			}
		}
		if last != nil {
			if err := a.special(*last); err != nil {
				return err
			}
		}
	}
}

// special handles a batch that holds no entries: a snapshot to install, or
// a membership change to decide (node.Committed.Decide).
func (a *Applier) special(c node.Committed) error {
	if c.Snapshot != nil {
		return a.installSnapshot(c)
	}
	refused, err := a.decide(c.Decide)
	if err != nil {
		return err
	}
	c.Decision <- refused
	return nil
}

// maxBatchBytes bounds the entry data applied in one engine batch. Queued
// batches are merged up to it, so that a busy leader commits one engine
// batch per several Readys; a batch larger than it is cut into pieces of
// about this size. Start-up replay is what meets the bound: raft hands over
// up to 1 MiB of entries per Ready (MaxCommittedSizePerReady), and the
// applier finds dozens of them queued. Merged into one engine batch, 787
// entries of a bulk load (79,000 puts) made a batch of tens of MiB, grown by
// copying into fresh memory, and the long copies stalled the collector's
// attempts to preempt the applier: the replay took 0.71-0.87 s, against
// 0.39-0.56 s in pieces of 256 KiB (docs/bench/performance.md, "Start-up
// replay in pieces").
const maxBatchBytes = 256 << 10

// entryBytes is the entry data in entries.
func entryBytes(entries []*raftpb.Entry) int {
	n := 0
	for _, e := range entries {
		n += len(e.GetData())
	}
	return n
}

// pieces cuts batches into runs of entries to apply in one engine batch
// each, in order: a run ends with the entry that brings its data to
// maxBytes or more. Batches under the bound come back as they are.
func pieces(batches []node.Committed, maxBytes int) [][]node.Committed {
	total := 0
	for _, c := range batches {
		total += entryBytes(c.Entries)
	}
	if total < maxBytes {
		return [][]node.Committed{batches}
	}
	var out [][]node.Committed
	var run []node.Committed
	size := 0
	for _, c := range batches {
		from := 0
		for i, e := range c.Entries {
			size += len(e.GetData())
			if size >= maxBytes {
				run = append(run, node.Committed{Entries: c.Entries[from : i+1], ConfStates: c.ConfStates})
				out = append(out, run)
				run, size, from = nil, 0, i+1
			}
		}
		if from < len(c.Entries) {
			run = append(run, node.Committed{Entries: c.Entries[from:], ConfStates: c.ConfStates})
		}
	}
	if len(run) > 0 {
		out = append(out, run)
	}
	return out
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
	waiting := a.cfg.Waiters.ids()
	defer func() {
		outcomeUnknown := make([]answer, len(waiting))
		for i, id := range waiting {
			outcomeUnknown[i] = answer{id: id, result: Result{Err: ErrOutcomeUnknown}}
		}
		a.cfg.Waiters.answer(outcomeUnknown)
	}()
	err := a.install(c.Snapshot)
	if err == nil {
		a.mu.Lock()
		close(a.mu.appliedCh)
		a.mu.appliedCh = make(chan struct{})
		a.mu.Unlock()
		if a.cfg.Notifier != nil {
			a.cfg.Notifier.Notify()
		}
	}
	c.Installed <- err
	if err == nil {
		if a.cfg.Progress != nil {
			a.cfg.Progress.Applied(a.applied.Load())
		}
		a.report(Outcome{Applied: a.applied.Load(), Members: a.Members(), Removed: a.removed, Installed: true})
	}
	return err
}

// install has the installer replace the store's content, then reloads
// what the applier, the lessor and the auth store keep of it.
func (a *Applier) install(snap *raftpb.Snapshot) error {
	if a.cfg.Installer == nil {
		return fmt.Errorf("no snapshot installer")
	}
	catchUp, err := a.cfg.Installer.Install(snap)
	if err != nil {
		return err
	}
	if catchUp != nil {
		from, start := a.applied.Load(), time.Now()
		st, err := a.InstallCatchUp(*catchUp)
		if err != nil {
			return err
		}
		if err := a.cfg.Installer.Durable(catchUp.End); err != nil {
			return err
		}
		a.logger.Info("installed incremental snapshot", zap.Uint64("index", snap.GetMetadata().GetIndex()),
			zap.Uint64("from", from), zap.Uint64("to", catchUp.End), zap.Int("own-entries", st.OwnEntries),
			zap.Int("records", st.Records), zap.Int("entries", st.Entries), zap.Duration("took", time.Since(start)))
	}
	if err := a.load(); err != nil {
		return err
	}
	if a.lessor != nil {
		if err := a.lessor.Load(a.store); err != nil {
			return fmt.Errorf("reload leases after install: %w", err)
		}
	}
	if a.cfg.Auth != nil {
		if err := a.cfg.Auth.Load(a.store.Reader()); err != nil {
			return fmt.Errorf("reload auth after install: %w", err)
		}
	}
	return nil
}

type answer struct {
	id     uint64
	result Result
}

// leases is what a Put may attach keys to: the lessor's leases, or none
// for an applier without a lessor (start-up recovery, whose replay writes
// lease records itself).
func (a *Applier) leases() mvcc.Leases {
	if a.lessor == nil {
		return nil
	}
	return a.lessor
}

func (a *Applier) applyBatches(batches []node.Committed) error {
	w := a.store.Write(a.leases())
	var answers []answer
	var last uint64
	ms := a.memberState()
	var confState *raftpb.ConfState
	// An engine that applied entries but holds no conf state lost it; the
	// node then has raft redeliver the log from its snapshot point
	// (node.raftAppliedIndex), and the membership entries among what the
	// engine already holds bring it back (the member list too, if that was
	// lost with it).
	repairConf := a.confState.Load() == nil && a.applied.Load() > 0
	repairMembers := repairConf && len(ms.list.Members) == 0
	for _, c := range batches {
		for _, e := range c.Entries {
			last = e.GetIndex()
			if last <= a.applied.Load() {
				// Redelivered: already in the engine.
				if cs := c.ConfStates[last]; cs != nil && repairConf {
					confState = cs
					if repairMembers {
						// The list is rebuilt with each change's first
						// decision, as raft is (Applier.decide).
						if err := ms.reapplyChange(e); err != nil {
							w.Abort()
							return fmt.Errorf("reapply conf change %d: %w", last, err)
						}
					}
				}
				continue
			}
			switch e.GetType() {
			case raftpb.EntryNormal:
				if len(e.GetData()) == 0 {
					continue // a new leader's empty entry
				}
				req, err := a.request(e)
				if err != nil {
					w.Abort()
					return err
				}
				revBefore := w.Rev()
				start := time.Now()
				res, err := a.applyRequest(w, req, ms, e.GetIndex())
				if took := time.Since(start); took > a.cfg.WarnApplyDuration {
					a.warnSlowApply(req, res, err, took)
				}
				if err == nil {
					err = w.RecordIndex(e.GetIndex(), revBefore) // for log compaction (logcompact.Build)
				}
				if err != nil {
					w.Abort()
					return fmt.Errorf("apply entry %d: %w", e.GetIndex(), err)
				}
				if id := requestID(req); id != 0 {
					answers = append(answers, answer{id: id, result: res})
				}
			case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
				cs := c.ConfStates[e.GetIndex()]
				if cs != nil {
					confState = cs
				}
				id, refused, err := ms.applyChange(e, a.cfg.MaxLearners)
				if err != nil {
					w.Abort()
					return fmt.Errorf("apply conf change %d: %w", e.GetIndex(), err)
				}
				if cs != nil {
					ms.list.Config = cs // the next change meets raft's configuration after this one
				}
				if refused != nil {
					a.logger.Warn("refused a membership change as it applied", zap.Uint64("index", e.GetIndex()), zap.Error(refused))
				}
				if id != 0 {
					answers = append(answers, answer{id: id, result: Result{Err: refused}})
				}
			}
		}
	}
	membersChanged := ms.changedMembers || ms.changedRemoved || ms.changedRefused
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
	if err := ms.write(w); err != nil {
		w.Abort()
		return err
	}
	if err := w.Commit(last); err != nil {
		return fmt.Errorf("commit applied batch up to %d: %w", last, err)
	}
	failpoint.Hit("apply/after-commit")
	// Visible from here on: publish, then answer the waiting clients.
	if confState != nil {
		a.confState.Store(confState)
	}
	members, removed := a.publish(ms)
	a.applied.Store(last)
	if a.cfg.Notifier != nil {
		a.cfg.Notifier.Notify()
	}
	a.mu.Lock()
	close(a.mu.appliedCh)
	a.mu.appliedCh = make(chan struct{})
	a.mu.Unlock()
	a.cfg.Waiters.answer(answers)
	// After the answers: a member that applied its own removal stops on
	// this outcome, and the client that asked for the removal must have
	// its answer first.
	if a.cfg.Progress != nil {
		a.cfg.Progress.Applied(last)
	}
	a.report(Outcome{Applied: last, Members: members, Removed: removed})
	return nil
}

// request returns the request a normal entry holds: the one this member
// proposed, if its client still waits and the entry holds exactly what
// was proposed (Waiters.RegisterRequest), else the entry decoded. On the
// leader under load the decode was 6% of the server's CPU
// (docs/bench/performance.md, "Versions encoded by hand, requests decoded
// once").
func (a *Applier) request(e *raftpb.Entry) (*pb.InternalRaftRequest, error) {
	if id := encodedRequestID(e.GetData()); id != 0 {
		if req := a.cfg.Waiters.proposed(id, e.GetData()); req != nil {
			return req, nil
		}
	}
	req := &pb.InternalRaftRequest{}
	if err := proto.Unmarshal(e.GetData(), req); err != nil {
		return nil, fmt.Errorf("decode entry %d: %w", e.GetIndex(), err)
	}
	return req, nil
}

// encodedRequestID is requestID of an encoded InternalRaftRequest, read
// without decoding the rest: its header's ID (field 100, the header's
// field 1) if set, else its ID (field 1). 0 if data holds neither or is
// malformed (proto.Unmarshal then says how).
func encodedRequestID(data []byte) uint64 {
	var id, headerID uint64
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return 0
		}
		data = data[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(data)
			if m < 0 {
				return 0
			}
			id, data = v, data[m:]
			continue
		case num == 100 && typ == protowire.BytesType:
			header, m := protowire.ConsumeBytes(data)
			if m < 0 {
				return 0
			}
			// A repeated message field merges into the earlier one: an
			// ID it does not set leaves the earlier one.
			if h, set := headerRequestID(header); set {
				headerID = h
			}
			data = data[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, data)
		if m < 0 {
			return 0
		}
		data = data[m:]
	}
	if headerID != 0 {
		return headerID
	}
	return id
}

// headerRequestID is the ID (field 1) of an encoded RequestHeader, and
// whether the encoding sets it.
func headerRequestID(data []byte) (id uint64, set bool) {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return 0, false
		}
		data = data[n:]
		if num == 1 && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(data)
			if m < 0 {
				return 0, false
			}
			id, set, data = v, true, data[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, data)
		if m < 0 {
			return 0, false
		}
		data = data[m:]
	}
	return id, set
}

// gate decides r before it is applied: a refusal by the raised alarms, then
// by auth, or an auth request applied (handled, as authApplier.apply
// returns it). Replay of a compacted batch's kept entries passes them
// through the same gate (replayKept), so that what the live applier
// refused changes nothing there either.
func (a *Applier) gate(w *mvcc.WriteBatch, r *pb.InternalRaftRequest) (res Result, handled bool, err error) {
	if err := a.refusedByAlarm(r); err != nil {
		return Result{Err: err}, true, nil
	}
	if a.auth != nil {
		return a.auth.apply(w, r)
	}
	return Result{}, false, nil
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
//
// index is the entry's: a simple token issued by an Authenticate request
// ends with it (auth.SimpleTokenIndex), as etcd's does, so that a member
// that has not applied the entry yet knows to wait for it.
func (a *Applier) applyRequest(w *mvcc.WriteBatch, r *pb.InternalRaftRequest, ms *memberState, index uint64) (Result, error) {
	if r.Authenticate != nil && r.Authenticate.SimpleToken != "" {
		r = proto.CloneOf(r) // the proposer's request is not ours to change
		r.Authenticate.SimpleToken = auth.SimpleToken(r.Authenticate.SimpleToken, index)
	}
	if res, handled, err := a.gate(w, r); handled || err != nil {
		return res, err
	}
	switch {
	case r.Alarm != nil:
		res, err := a.applyAlarm(w, r.Alarm)
		return res, err
	case r.Put != nil:
		resp, err := w.Put(r.Put)
		return Result{Response: resp, Err: err}, nil
	case r.DeleteRange != nil:
		resp, err := w.DeleteRange(r.DeleteRange)
		return Result{Response: resp, Err: err}, nil
	case r.Txn != nil:
		resp, err := w.Txn(r.Txn)
		return Result{Response: resp, Err: err}, nil
	case r.Compaction != nil:
		resp, done, err := w.Compact(r.Compaction)
		return Result{Response: resp, Err: err, Compacted: done}, nil
	case r.LeaseGrant != nil && a.lessor != nil:
		resp, err := a.lessor.Grant(w, r.LeaseGrant)
		return Result{Response: resp, Err: err}, nil
	case r.LeaseRevoke != nil && a.lessor != nil:
		resp, err := a.lessor.Revoke(w, r.LeaseRevoke)
		return Result{Response: resp, Err: err}, nil
	case r.LeaseCheckpoint != nil && a.lessor != nil:
		resp, err := a.lessor.Checkpoint(w, r.LeaseCheckpoint)
		return Result{Response: resp, Err: err}, nil
	case r.ClusterMemberAttrSet != nil:
		ms.setAttributes(r.ClusterMemberAttrSet)
		return Result{Response: &pb.MemberUpdateResponse{}}, nil
	default:
		// A request kind this version does not know: refuse it the same
		// way on every member rather than stop applying.
		return Result{Err: ErrUnsupportedRequest}, nil
	}
}

// ErrUnsupportedRequest answers a replicated request of a kind this
// version does not apply.
var ErrUnsupportedRequest = fmt.Errorf("apply: unsupported request")

// warnSlowApply logs a request whose apply took longer than
// WarnApplyDuration, in etcd's words and fields; the request's secrets
// (put values, passwords) are left out as etcd leaves them out.
func (a *Applier) warnSlowApply(req *pb.InternalRaftRequest, res Result, err error, took time.Duration) {
	resp := ""
	if res.Response != nil {
		resp = fmt.Sprintf("size:%d", proto.Size(res.Response))
	}
	if err == nil {
		err = res.Err
	}
	a.logger.Warn("apply request took too long",
		zap.Duration("took", took),
		zap.Duration("expected-duration", a.cfg.WarnApplyDuration),
		zap.String("prefix", ""),
		zap.String("request", (&pb.InternalRaftStringer{Request: req}).String()),
		zap.String("response", resp),
		zap.Error(err))
}
