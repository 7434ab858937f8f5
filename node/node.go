// Package node owns strata's raft state machine: one goroutine drives a
// go.etcd.io/raft/v3 RawNode and performs, for every Ready, the steps the raft
// library asks of its caller, in the order it requires:
//
//  1. persist the Ready's entries and HardState to the raft log, with one
//     fsync (group commit: every proposal and peer message that arrived
//     since the last Ready shares that sync);
//  2. send the Ready's messages to peers, after the entries they acknowledge
//     are durable (a leader sends before its own fsync, as etcd does);
//  3. answer ReadIndex requests whose read state arrived;
//  4. apply membership changes to raft, then hand the committed entries to
//     the applier, which applies them to the state machine on its own
//     goroutine so that applying batch N overlaps with syncing batch N+1;
//  5. Advance.
//
// The node also keeps the log short (DESIGN.md rule 4): once enough entries
// have been applied it asks the engine to flush, and when the flush reports a
// durable index D it compacts the log up to D (less a catch-up margin kept
// for slow followers).
//
// Concurrency: New starts nothing; Run is the node goroutine, the only one
// that touches the RawNode and writes the log. Propose, ReadIndex, Status and
// the accessors are safe from any goroutine.
package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"
)

// Errors returned to callers of Propose and ReadIndex.
var (
	// ErrStopped means the node has stopped.
	ErrStopped = errors.New("node: stopped")
	// ErrNoLeader means raft has no leader to take the request.
	ErrNoLeader = errors.New("node: no leader")
)

// Log is what the node needs from the raft log: raft's read interface plus
// the two writes the node goroutine performs.
type Log interface {
	raft.Storage
	// Append durably writes entries and the HardState with one sync.
	Append(entries []*raftpb.Entry, hs *raftpb.HardState) error
	// Compact drops entries <= index, recording cs as the conf state there.
	Compact(index uint64, cs *raftpb.ConfState) error
	// ApplySnapshot discards the log and restarts it after the snapshot.
	ApplySnapshot(meta *raftpb.SnapshotMetadata) error
	// BeginSnapshot durably records a snapshot about to be installed into
	// the state machine, PendingSnapshot returns the record (nil if none),
	// and ForgetPendingSnapshot removes it: see reconcileSnapshot and
	// Node.pendingUntil.
	BeginSnapshot(meta *raftpb.SnapshotMetadata) error
	PendingSnapshot() *raftpb.SnapshotMetadata
	ForgetPendingSnapshot() error
}

// Committed is a batch of committed entries handed to the applier, in log
// order. ConfStates holds, for each membership-change entry in the batch,
// the conf state raft reached by applying it.
type Committed struct {
	Entries    []*raftpb.Entry
	ConfStates map[uint64]*raftpb.ConfState
	// Snapshot, when set, is a snapshot to install before anything that
	// follows; the applier reports the outcome on Installed.
	Snapshot  *raftpb.Snapshot
	Installed chan<- error
}

// Engine is what the node needs from the state machine's storage to keep the
// log short: a way to make applied state durable, and what is durable now.
type Engine interface {
	Flush() error
	DurableIndex() uint64
}

// Transport carries raft messages to peers. Send must not block.
type Transport interface {
	Send(msgs []*raftpb.Message)
}

// Config configures a Node.
type Config struct {
	// ID is this member's raft ID.
	ID uint64
	// Peers, if not empty, bootstraps a new cluster with these members; it
	// is ignored when the log already holds state (the data dir wins).
	Peers []raft.Peer
	// Join starts a member added to a running cluster: its log starts
	// empty and the leader fills it (entries or a snapshot).
	Join bool
	// Log is the raft log, already opened and recovered.
	Log Log
	// Engine is flushed to let the log be compacted.
	Engine Engine
	// Transport sends raft messages to peers; nil for a member that has
	// none (it must then be the only voter).
	Transport Transport
	// Applied is the index the state machine has applied (read back from
	// the engine at start-up); raft redelivers committed entries after it.
	Applied uint64
	// ConfState is the membership the state machine holds at Applied.
	ConfState *raftpb.ConfState
	// TickInterval is the heartbeat interval; ElectionTicks and
	// HeartbeatTicks count in it.
	TickInterval   time.Duration
	ElectionTicks  int
	HeartbeatTicks int
	// SnapshotCount is how many applied entries trigger an engine flush and
	// a log compaction (etcd's --snapshot-count).
	SnapshotCount uint64
	// CatchUpEntries are kept in the log below the durable index so that a
	// slightly slow follower catches up from the log, not a snapshot.
	CatchUpEntries uint64
	// MaxSizePerMsg and MaxInflightMsgs bound replication traffic.
	MaxSizePerMsg   uint64
	MaxInflightMsgs int
	Logger          *zap.Logger
}

// Node drives raft. See the package comment.
type Node struct {
	cfg    Config
	logger *zap.Logger
	rn     *raft.RawNode // owned by the Run goroutine

	propc    chan proposal
	recvc    chan *raftpb.Message
	ctrlc    chan func(rn *raft.RawNode)
	readc    chan chan readResult
	appliedc chan uint64 // applied index reports from the applier
	flushc   chan uint64 // durable index reached by a background flush
	committc chan Committed
	done     chan struct{}
	// flushes counts the background engine flush (at most one at a time);
	// Run waits for it, so that nothing touches the engine after Run.
	flushes  sync.WaitGroup
	stopOnce sync.Once

	// Published by the Run goroutine for readers on other goroutines.
	term     atomic.Uint64
	leader   atomic.Uint64
	commit   atomic.Uint64
	lastIdx  atomic.Uint64
	firstIdx atomic.Uint64
	leaderCh atomic.Pointer[chan struct{}] // closed when a leader is known
	stopErr  atomic.Pointer[error]
	// leaderChanges counts the times a new leader became known (metrics).
	leaderChanges atomic.Uint64

	// State of the Run goroutine only.
	readSeq      uint64
	readPending  []chan readResult            // waiting for the next ReadIndex round
	readInFlight map[uint64][]chan readResult // round context -> waiters
	readIssuedAt map[uint64]int               // round context -> tick it was issued at
	ticks        int
	applied      uint64 // highest index the applier reported
	// pendingUntil, if not 0, is the state machine's applied index after a
	// snapshot install, which may be past the log's last index: the
	// install's record (Log.BeginSnapshot) stays until the log's last
	// index reaches it, so that a restart before then accepts an engine
	// past the log's end (reconcileSnapshot). Once the log holds every
	// entry the engine applied, it always will: entries are appended
	// before they are applied.
	pendingUntil    uint64
	compactedTo     uint64 // log compacted up to here
	flushing        bool
	confHistory     []confAt // conf states by index, for log compaction points
	lastConfState   *raftpb.ConfState
	hardState       *raftpb.HardState // the latest raft reported
	persistedCommit uint64            // commit index of the last HardState written
}

type confAt struct {
	index uint64
	cs    *raftpb.ConfState
}

type proposal struct {
	data []byte
	cc   raftpb.ConfChangeI
	errc chan error
}

type readResult struct {
	index uint64
	err   error
}

// New creates a node over an opened log. It starts no goroutine.
func New(cfg Config) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.SnapshotCount == 0 {
		cfg.SnapshotCount = 10000
	}
	if cfg.MaxSizePerMsg == 0 {
		cfg.MaxSizePerMsg = 1 << 20
	}
	if cfg.MaxInflightMsgs == 0 {
		cfg.MaxInflightMsgs = 256
	}
	pendingUntil, err := reconcileSnapshot(&cfg)
	if err != nil {
		return nil, err
	}
	first, err := cfg.Log.FirstIndex()
	if err != nil {
		return nil, fmt.Errorf("read first log index: %w", err)
	}
	raftApplied := raftAppliedIndex(cfg, first-1)
	storage := &restartStorage{Log: cfg.Log, applied: cfg.Applied, confState: cfg.ConfState}
	rc := &raft.Config{
		ID:                        cfg.ID,
		ElectionTick:              cfg.ElectionTicks,
		HeartbeatTick:             cfg.HeartbeatTicks,
		Storage:                   storage,
		Applied:                   raftApplied,
		MaxSizePerMsg:             cfg.MaxSizePerMsg,
		MaxInflightMsgs:           cfg.MaxInflightMsgs,
		MaxUncommittedEntriesSize: 1 << 30,
		CheckQuorum:               true,
		PreVote:                   true,
		Logger:                    &raftLogger{cfg.Logger.Sugar()},
	}
	last, err := cfg.Log.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("read last log index: %w", err)
	}
	if cfg.Applied > last {
		return nil, fmt.Errorf("engine applied index %d is past the log's last index %d: the log lost synced entries", cfg.Applied, last)
	}
	rn, err := raft.NewRawNode(rc)
	if err != nil {
		return nil, fmt.Errorf("create raft node: %w", err)
	}
	fresh := last == 0
	if fresh {
		switch {
		case cfg.Join:
		case len(cfg.Peers) == 0:
			return nil, errors.New("empty log and no peers to bootstrap")
		default:
			if err := rn.Bootstrap(cfg.Peers); err != nil {
				return nil, fmt.Errorf("bootstrap raft: %w", err)
			}
		}
	}
	n := &Node{
		cfg:           cfg,
		logger:        cfg.Logger,
		rn:            rn,
		propc:         make(chan proposal, 1024),
		recvc:         make(chan *raftpb.Message, 4096),
		ctrlc:         make(chan func(*raft.RawNode), 64),
		readc:         make(chan chan readResult, 1024),
		appliedc:      make(chan uint64, 16),
		flushc:        make(chan uint64, 1),
		committc:      make(chan Committed, 64),
		done:          make(chan struct{}),
		readInFlight:  map[uint64][]chan readResult{},
		readIssuedAt:  map[uint64]int{},
		applied:       cfg.Applied,
		pendingUntil:  pendingUntil,
		compactedTo:   first - 1,
		lastConfState: cfg.ConfState,
	}
	if cfg.ConfState != nil {
		n.confHistory = []confAt{{index: cfg.Applied, cs: cfg.ConfState}}
	} else if _, logCS, err := cfg.Log.InitialState(); err == nil && logCS != nil && len(logCS.GetVoters()) > 0 {
		// The state machine holds no conf state (raftAppliedIndex): raft
		// replays the log from its snapshot point, where the log's conf
		// state is the membership. Log truncation and the snapshots this
		// member sends need it even if no membership entry follows (its
		// history would stay empty: no truncation, and snapshots with an
		// empty ConfState that followers refuse).
		n.confHistory = []confAt{{index: first - 1, cs: logCS}}
		n.lastConfState = logCS
	} else if err != nil {
		return nil, fmt.Errorf("read the log's conf state: %w", err)
	}
	storage.node = n
	ch := make(chan struct{})
	n.leaderCh.Store(&ch)
	n.lastIdx.Store(last)
	n.firstIdx.Store(first)
	return n, nil
}

// reconcileSnapshot finishes, at start-up, a snapshot install that a crash
// or a stop interrupted, and accepts an engine that an install left past
// the log's end. An install has two steps in two stores (installSnapshot):
// the state machine takes the snapshot, then the log restarts after it;
// and the state machine may then be past the log's last index (a full
// snapshot carries the leader's engine at its applied index X >= the
// snapshot's index S; an incremental one may end above S) until the log
// has received the entries up to X. Before the first step the node records
// the snapshot's metadata in the log (BeginSnapshot); it removes the
// record once the log's last index has reached the engine's applied index
// (pendingUntil). With a record left at start-up:
//
//  1. if the state machine is at or past the snapshot's index, it took the
//     snapshot: the log is restarted after it, unless it already was;
//     otherwise the install did not reach the state machine, and the log
//     is left as it is;
//  2. if the state machine is now at or below the log's last index, the
//     record has served and is removed;
//  3. otherwise the state machine is past the log's end because of an
//     install: raft is told that the log's snapshot point was applied,
//     with the log's ConfState there. It redelivers the log's entries and
//     learns the rest from the leader; the node applies their membership
//     changes to raft, and the applier skips what its engine holds, as
//     after an install at run time. (This member cannot become leader
//     meanwhile: its log lacks committed entries.) The record stays until
//     the log reaches the engine's index, which is returned.
//
// Without a record, an engine past the log's last index means the log lost
// synced entries, and New refuses to start.
func reconcileSnapshot(cfg *Config) (pendingUntil uint64, err error) {
	p := cfg.Log.PendingSnapshot()
	if p == nil {
		return 0, nil
	}
	first, err := cfg.Log.FirstIndex()
	if err != nil {
		return 0, fmt.Errorf("read first log index: %w", err)
	}
	if cfg.Applied >= p.GetIndex() && first-1 < p.GetIndex() {
		cfg.Logger.Info("restarting the raft log after a snapshot the state machine installed before a crash or stop",
			zap.Uint64("snapshot-index", p.GetIndex()), zap.Uint64("snapshot-term", p.GetTerm()),
			zap.Uint64("applied-index", cfg.Applied))
		if err := cfg.Log.ApplySnapshot(p); err != nil {
			return 0, fmt.Errorf("restart raft log after pending snapshot %d: %w", p.GetIndex(), err)
		}
	}
	last, err := cfg.Log.LastIndex()
	if err != nil {
		return 0, fmt.Errorf("read last log index: %w", err)
	}
	if cfg.Applied <= last {
		if err := cfg.Log.ForgetPendingSnapshot(); err != nil {
			return 0, fmt.Errorf("drop pending snapshot %d: %w", p.GetIndex(), err)
		}
		return 0, nil
	}
	if first, err = cfg.Log.FirstIndex(); err != nil {
		return 0, fmt.Errorf("read first log index: %w", err)
	}
	_, cs, err := cfg.Log.InitialState()
	if err != nil {
		return 0, fmt.Errorf("read the log's conf state: %w", err)
	}
	cfg.Logger.Info("the state machine is past the raft log's end after a snapshot install; raft restarts from the log's snapshot point",
		zap.Uint64("applied-index", cfg.Applied), zap.Uint64("log-snapshot-index", first-1), zap.Uint64("log-last-index", last))
	pendingUntil = cfg.Applied
	cfg.Applied, cfg.ConfState = first-1, cs
	return pendingUntil, nil
}

// forgetPendingSnapshot removes the record of the last snapshot install
// once the log holds every entry up to the state machine's applied index
// after it (pendingUntil).
func (n *Node) forgetPendingSnapshot() error {
	if n.pendingUntil == 0 || n.lastIdx.Load() < n.pendingUntil {
		return nil
	}
	if err := n.cfg.Log.ForgetPendingSnapshot(); err != nil {
		return fmt.Errorf("drop the record of snapshot install: %w", err)
	}
	n.pendingUntil = 0
	return nil
}

// raftAppliedIndex is the index raft is told was applied, so that it
// redelivers the committed entries after it. That is the state machine's
// applied index, whose conf state (Config.ConfState) tells raft the
// membership there, except when the state machine holds no conf state
// although it applied entries beyond the log's snapshot point logSnap:
// every cluster's log begins with membership entries, so its engine lost
// the conf state written with them, and raft, told those entries were
// applied, would neither redeliver them nor find the membership anywhere
// else (the log's snapshot point predates them). raft would then run with
// an empty configuration for good: unable to campaign, and deaf to its
// peers' responses (RawNode.Step drops a response from a member outside
// its configuration), ReadIndex answers included. raft is instead told
// that only the log's snapshot point was applied, with the log's conf
// state there, and redelivers the entries after it; the node applies the
// membership entries among them to raft as it does for any committed
// entry, and the applier, which skips what the engine already holds,
// writes their conf state back.
func raftAppliedIndex(cfg Config, logSnap uint64) uint64 {
	if cfg.ConfState != nil || cfg.Applied <= logSnap {
		return cfg.Applied
	}
	cfg.Logger.Warn("the state machine holds no raft conf state at its applied index; raft replays the log from its snapshot point to learn the membership",
		zap.Uint64("applied-index", cfg.Applied), zap.Uint64("log-snapshot-index", logSnap))
	return logSnap
}

// restartStorage adjusts what raft reads at start-up. The HardState's commit
// index is persisted lazily (a commit-only change is not synced, as in
// etcd), so after a crash it may trail what the engine applied; entries the
// engine applied were committed, so commit is raised to the applied index.
// The conf state is the state machine's, which matches Config.Applied.
//
// It also answers Snapshot with the state machine's current applied index
// rather than the log's compaction point: a follower is sent the engine as
// it is now, so the snapshot's membership must be today's (a member added
// after the compaction point must find itself in it, or raft refuses the
// snapshot). raft calls Snapshot on the node goroutine, which owns node.
type restartStorage struct {
	Log
	applied   uint64
	confState *raftpb.ConfState
	node      *Node
}

func (s *restartStorage) Snapshot() (*raftpb.Snapshot, error) {
	n := s.node
	if n == nil || n.applied <= n.compactedTo {
		return s.Log.Snapshot()
	}
	term, err := s.Log.Term(n.applied)
	if err != nil {
		return s.Log.Snapshot()
	}
	var cs *raftpb.ConfState
	for _, c := range n.confHistory {
		if c.index <= n.applied {
			cs = c.cs
		}
	}
	if cs == nil {
		cs = n.lastConfState
	}
	return &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{
		Index: proto.Uint64(n.applied), Term: proto.Uint64(term), ConfState: cs,
	}}, nil
}

func (s *restartStorage) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	hs, cs, err := s.Log.InitialState()
	if err != nil {
		return nil, nil, err
	}
	if hs.GetCommit() < s.applied {
		hs = proto.CloneOf(hs)
		hs.Commit = proto.Uint64(s.applied)
	}
	if s.confState != nil {
		cs = s.confState
	}
	return hs, cs, nil
}

// Committed returns the channel of committed entry batches. The applier
// must drain it and report progress with Applied.
func (n *Node) Committed() <-chan Committed { return n.committc }

// Applied reports that the state machine has applied (and committed to the
// engine) every entry up to index.
func (n *Node) Applied(index uint64) {
	select {
	case n.appliedc <- index:
	case <-n.done:
	default:
		// The channel holds reports the node has not read yet; replace
		// one with this higher report rather than block the applier.
		select {
		case <-n.appliedc:
		default:
		}
		select {
		case n.appliedc <- index:
		default:
		}
	}
}

// Propose replicates data. It returns once raft accepted the proposal into
// its log (not once it committed: callers wait for the applier's answer).
func (n *Node) Propose(ctx context.Context, data []byte) error {
	return n.propose(ctx, proposal{data: data, errc: make(chan error, 1)})
}

// ProposeConfChange replicates a membership change. raft refuses a change
// while another is pending by turning it into an empty entry, so callers
// wait for the applier's answer with a deadline.
func (n *Node) ProposeConfChange(ctx context.Context, cc raftpb.ConfChangeI) error {
	return n.propose(ctx, proposal{cc: cc, errc: make(chan error, 1)})
}

func (n *Node) propose(ctx context.Context, p proposal) error {
	select {
	case n.propc <- p:
	case <-ctx.Done():
		return ctx.Err()
	case <-n.done:
		return n.err()
	}
	select {
	case err := <-p.errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-n.done:
		return n.err()
	}
}

// ReadIndex returns a commit index that a linearizable read must wait to
// see applied. Concurrent callers share one raft ReadIndex round.
func (n *Node) ReadIndex(ctx context.Context) (uint64, error) {
	c := make(chan readResult, 1)
	select {
	case n.readc <- c:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.done:
		return 0, n.err()
	}
	select {
	case r := <-c:
		return r.index, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.done:
		return 0, n.err()
	}
}

// WaitLeader blocks until a leader is known or ctx ends.
func (n *Node) WaitLeader(ctx context.Context) error {
	select {
	case <-*n.leaderCh.Load():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.done:
		return n.err()
	}
}

// Term returns the current raft term.
func (n *Node) Term() uint64 { return n.term.Load() }

// Leader returns the current leader's ID, or 0 if none is known.
func (n *Node) Leader() uint64 { return n.leader.Load() }

// CommitIndex returns raft's commit index.
func (n *Node) CommitIndex() uint64 { return n.commit.Load() }

// ID returns this member's raft ID.
func (n *Node) ID() uint64 { return n.cfg.ID }

// Done is closed when Run returns.
func (n *Node) Done() <-chan struct{} { return n.done }

func (n *Node) err() error {
	if p := n.stopErr.Load(); p != nil {
		return *p
	}
	return ErrStopped
}

// Run drives raft until ctx ends or a storage error stops it; a storage
// error (a failed fsync above all) is returned and is fatal: the process
// must not go on as if the write had happened.
func (n *Node) Run(ctx context.Context) error {
	err := n.run(ctx)
	n.flushes.Wait()
	if err == nil {
		err = ErrStopped
	}
	n.stopErr.Store(&err)
	n.stopOnce.Do(func() { close(n.done) })
	if errors.Is(err, ErrStopped) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func (n *Node) run(ctx context.Context) error {
	ticker := time.NewTicker(n.cfg.TickInterval)
	defer ticker.Stop()
	// A cluster of one need not wait out an election timeout.
	n.campaignAlone()
	for {
		if n.rn.HasReady() {
			if err := n.handleReady(ctx); err != nil {
				return err
			}
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
			n.rn.Tick()
			n.ticks++
			if err := n.persistCommit(); err != nil {
				return err
			}
			if n.ticks <= 3 {
				// A fresh cluster of one can campaign as soon as its
				// bootstrap membership is applied, not an election
				// timeout later.
				n.campaignAlone()
			}
			n.retryStaleReads()
		case p := <-n.propc:
			n.handleProposal(p)
			n.drainInput()
		case m := <-n.recvc:
			n.step(m)
			n.drainInput()
		case f := <-n.ctrlc:
			f(n.rn)
		case c := <-n.readc:
			n.readPending = append(n.readPending, c)
			n.issueReadIndex()
		case idx := <-n.appliedc:
			n.handleApplied(idx)
		case d := <-n.flushc:
			n.flushing = false
			if err := n.compactLog(d); err != nil {
				return err
			}
		}
	}
}

// drainInput takes the proposals and peer messages already queued, so that
// one Ready, and so one fsync, carries all of them: without it a follower
// would sync once per message from the leader, and a leader once per
// acknowledgement.
func (n *Node) drainInput() {
	for i := 0; i < 4096; i++ {
		select {
		case p := <-n.propc:
			n.handleProposal(p)
		case m := <-n.recvc:
			n.step(m)
		default:
			return
		}
	}
}

// campaignAlone starts an election at once if this member is the only
// voter and no leader is known: a cluster of one need not wait out an
// election timeout. raft refuses while the bootstrap membership is
// committed but not yet applied; the next ticks try again.
//
// Whether this member is the only voter is raft's own configuration, not
// the state machine's conf state: at a restart whose engine holds no conf
// state yet (nothing was flushed before a crash), raft's configuration is
// empty until the replayed membership entries are applied, and a member of
// a larger cluster must not take itself for a cluster of one.
func (n *Node) campaignAlone() {
	if n.leader.Load() != raft.None {
		return
	}
	st := n.rn.Status()
	if st.RaftState == raft.StateLeader {
		return
	}
	voters := st.Config.Voters.IDs()
	if _, ok := voters[n.cfg.ID]; !ok || len(voters) != 1 {
		return
	}
	_ = n.rn.Campaign()
}

func (n *Node) handleProposal(p proposal) {
	var err error
	if p.cc != nil {
		err = n.rn.ProposeConfChange(p.cc)
	} else {
		err = n.rn.Propose(p.data)
	}
	if errors.Is(err, raft.ErrProposalDropped) && n.leader.Load() == 0 {
		err = ErrNoLeader
	}
	p.errc <- err
}

func (n *Node) handleReady(ctx context.Context) error {
	rd := n.rn.Ready()
	if rd.SoftState != nil {
		if lead := rd.SoftState.Lead; lead != raft.None && lead != n.leader.Load() {
			n.leaderChanges.Add(1)
		}
		n.leader.Store(rd.SoftState.Lead)
		if rd.SoftState.Lead != raft.None {
			ch := n.leaderCh.Load()
			select {
			case <-*ch:
			default:
				close(*ch)
			}
		} else {
			// Waiters hold the current channel: replace it only once it
			// was closed, that is when a known leader was lost.
			select {
			case <-*n.leaderCh.Load():
				ch := make(chan struct{})
				n.leaderCh.Store(&ch)
			default:
			}
		}
	}
	// Step 1: persist. A commit-only HardState change need not be synced
	// at once (rd.MustSync is false): every append carries the latest
	// HardState, and an idle member writes a newer commit index on its next
	// tick (persistCommit). A member restarted cut off from its peers can
	// then apply what it knew was committed, instead of serving state older
	// than it served before.
	var hs *raftpb.HardState
	if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
		n.term.Store(rd.HardState.GetTerm())
		n.commit.Store(rd.HardState.GetCommit())
		n.hardState = rd.HardState
		if rd.MustSync {
			hs = rd.HardState
		}
	}
	if len(rd.Entries) > 0 && hs == nil {
		hs = n.hardState
	}
	// A follower must not apply (and so serve) entries beyond the commit
	// index its log records, or after a crash it could serve older state
	// than it did before. A leader's commit-only changes come once per
	// write batch; syncing each would double its fsyncs, so a leader
	// records them on its next tick instead.
	if hs == nil && n.hardState != nil && len(rd.CommittedEntries) > 0 && n.leader.Load() != n.cfg.ID &&
		rd.CommittedEntries[len(rd.CommittedEntries)-1].GetIndex() > n.persistedCommit {
		hs = n.hardState
	}
	if rd.Snapshot != nil && !raft.IsEmptySnap(rd.Snapshot) {
		if err := n.installSnapshot(ctx, rd.Snapshot); err != nil {
			return err
		}
	}
	// A leader may send its messages before its own fsync (raft thesis
	// 10.2.1, as etcd does): followers persist what it sends before they
	// acknowledge, and the leader counts itself only once Advance confirms
	// its own append. The disk writes of leader and followers then overlap.
	sentEarly := false
	if n.leader.Load() == n.cfg.ID && len(rd.Messages) > 0 && n.cfg.Transport != nil {
		n.cfg.Transport.Send(rd.Messages)
		sentEarly = true
	}
	if len(rd.Entries) > 0 || hs != nil {
		if err := n.cfg.Log.Append(rd.Entries, hs); err != nil {
			return fmt.Errorf("append to raft log: %w", err)
		}
		if hs != nil {
			n.persistedCommit = hs.GetCommit()
		}
		if len(rd.Entries) > 0 {
			n.lastIdx.Store(rd.Entries[len(rd.Entries)-1].GetIndex())
			if err := n.forgetPendingSnapshot(); err != nil {
				return err
			}
		}
	}
	// Step 2: messages, after the entries they acknowledge are durable.
	if !sentEarly && len(rd.Messages) > 0 && n.cfg.Transport != nil {
		n.cfg.Transport.Send(rd.Messages)
	}
	// Step 3: linearizable reads.
	for _, rs := range rd.ReadStates {
		n.answerReads(rs)
	}
	// Step 4: membership, then the applier.
	if len(rd.CommittedEntries) > 0 {
		c := Committed{Entries: rd.CommittedEntries}
		for _, e := range rd.CommittedEntries {
			var cc raftpb.ConfChangeI
			switch e.GetType() {
			case raftpb.EntryConfChange:
				var v1 raftpb.ConfChange
				if err := proto.Unmarshal(e.GetData(), &v1); err != nil {
					return fmt.Errorf("decode conf change at index %d: %w", e.GetIndex(), err)
				}
				cc = &v1
			case raftpb.EntryConfChangeV2:
				var v2 raftpb.ConfChangeV2
				if err := proto.Unmarshal(e.GetData(), &v2); err != nil {
					return fmt.Errorf("decode conf change at index %d: %w", e.GetIndex(), err)
				}
				cc = &v2
			default:
				continue
			}
			cs := n.rn.ApplyConfChange(cc)
			if c.ConfStates == nil {
				c.ConfStates = map[uint64]*raftpb.ConfState{}
			}
			c.ConfStates[e.GetIndex()] = cs
			n.confHistory = append(n.confHistory, confAt{index: e.GetIndex(), cs: cs})
			n.lastConfState = cs
		}
		if err := n.handOff(ctx, c); err != nil {
			return err
		}
	}
	// Step 5.
	n.rn.Advance(rd)
	return nil
}

// installSnapshot has the applier make the state machine hold a snapshot
// from the leader (after every entry handed over before it), then restarts
// the log after it. The order is the durability
// argument: once the log forgets the entries before the snapshot, the
// engine must already hold their effect.
func (n *Node) installSnapshot(ctx context.Context, snap *raftpb.Snapshot) error {
	meta := snap.GetMetadata()
	// Recorded before the state machine takes it, so that start-up can
	// finish an install a crash interrupts (reconcileSnapshot).
	if err := n.cfg.Log.BeginSnapshot(meta); err != nil {
		return fmt.Errorf("record snapshot %d before installing it: %w", meta.GetIndex(), err)
	}
	done := make(chan error, 1)
	if err := n.handOff(ctx, Committed{Snapshot: snap, Installed: done}); err != nil {
		return err
	}
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("install snapshot at index %d: %w", meta.GetIndex(), err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := n.cfg.Log.ApplySnapshot(meta); err != nil {
		return fmt.Errorf("restart raft log after snapshot %d: %w", meta.GetIndex(), err)
	}
	n.applied = max(n.applied, meta.GetIndex())
	n.compactedTo = meta.GetIndex()
	n.firstIdx.Store(meta.GetIndex() + 1)
	n.lastIdx.Store(meta.GetIndex())
	n.confHistory = []confAt{{index: meta.GetIndex(), cs: meta.GetConfState()}}
	n.lastConfState = meta.GetConfState()
	// The install ended with the engine durable at its new applied index,
	// which may be past the snapshot's: the record stays until the log
	// reaches it (pendingUntil).
	n.pendingUntil = meta.GetIndex()
	if n.cfg.Engine != nil {
		n.pendingUntil = max(n.pendingUntil, n.cfg.Engine.DurableIndex())
	}
	n.logger.Info("installed snapshot", zap.Uint64("index", meta.GetIndex()), zap.Uint64("term", meta.GetTerm()))
	return n.forgetPendingSnapshot()
}

// step feeds a message from a peer to raft.
func (n *Node) step(m *raftpb.Message) {
	if err := n.rn.Step(m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
		n.logger.Debug("step message", zap.Stringer("type", m.GetType()), zap.Uint64("from", m.GetFrom()), zap.Error(err))
	}
}

// Process hands a message received from a peer to the node goroutine. It
// implements the transport's Handler.
func (n *Node) Process(ctx context.Context, m *raftpb.Message) error {
	select {
	case n.recvc <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.done:
		return n.err()
	}
}

// control runs f on the node goroutine, without waiting for it.
func (n *Node) control(f func(*raft.RawNode)) {
	select {
	case n.ctrlc <- f:
	case <-n.done:
	}
}

// ReportUnreachable tells raft a peer could not be reached, so that it
// stops pipelining to it.
func (n *Node) ReportUnreachable(id uint64) {
	n.control(func(rn *raft.RawNode) { rn.ReportUnreachable(id) })
}

// ReportSnapshot tells raft how sending a snapshot to a peer ended.
func (n *Node) ReportSnapshot(id uint64, status raft.SnapshotStatus) {
	n.control(func(rn *raft.RawNode) { rn.ReportSnapshot(id, status) })
}

// TransferLeadership asks the leader to hand leadership to transferee and
// waits until a leader other than this member is known, or ctx ends.
func (n *Node) TransferLeadership(ctx context.Context, transferee uint64) error {
	n.control(func(rn *raft.RawNode) { rn.TransferLeader(transferee) })
	for n.leader.Load() != transferee {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-n.done:
			return n.err()
		case <-time.After(n.cfg.TickInterval):
		}
	}
	return nil
}

// Status returns raft's status, with each follower's progress when this
// member leads. It waits for the node goroutine.
func (n *Node) Status(ctx context.Context) (raft.Status, error) {
	c := make(chan raft.Status, 1)
	n.control(func(rn *raft.RawNode) { c <- rn.Status() })
	select {
	case st := <-c:
		return st, nil
	case <-ctx.Done():
		return raft.Status{}, ctx.Err()
	case <-n.done:
		return raft.Status{}, n.err()
	}
}

// persistCommit writes the latest HardState if its commit index is newer
// than the one in the log: at most one small synced write per tick, and
// none while appends carry the HardState anyway.
func (n *Node) persistCommit() error {
	if n.hardState == nil || n.hardState.GetCommit() <= n.persistedCommit {
		return nil
	}
	if err := n.cfg.Log.Append(nil, n.hardState); err != nil {
		return fmt.Errorf("persist commit index: %w", err)
	}
	n.persistedCommit = n.hardState.GetCommit()
	return nil
}

// handOff gives committed entries to the applier. While the applier is
// busy it keeps taking its progress reports, so the two never wait on each
// other.
func (n *Node) handOff(ctx context.Context, c Committed) error {
	for {
		select {
		case n.committc <- c:
			return nil
		case idx := <-n.appliedc:
			n.handleApplied(idx)
		case d := <-n.flushc:
			n.flushing = false
			if err := n.compactLog(d); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// issueReadIndex starts a ReadIndex round for the pending readers unless
// one is already in flight; readers that arrive meanwhile wait for the next
// round, so a round costs one heartbeat however many reads it serves.
func (n *Node) issueReadIndex() {
	if len(n.readInFlight) > 0 || len(n.readPending) == 0 {
		return
	}
	n.readSeq++
	var rctx [8]byte
	binary.BigEndian.PutUint64(rctx[:], n.readSeq)
	n.readInFlight[n.readSeq] = n.readPending
	n.readIssuedAt[n.readSeq] = n.ticks
	n.readPending = nil
	n.rn.ReadIndex(rctx[:])
}

func (n *Node) answerReads(rs raft.ReadState) {
	if len(rs.RequestCtx) != 8 {
		return
	}
	seq := binary.BigEndian.Uint64(rs.RequestCtx)
	for _, c := range n.readInFlight[seq] {
		c <- readResult{index: rs.Index}
	}
	delete(n.readInFlight, seq)
	delete(n.readIssuedAt, seq)
	n.issueReadIndex()
}

// retryStaleReads reissues a ReadIndex round that raft dropped (a leader
// change loses them silently) after an election timeout.
func (n *Node) retryStaleReads() {
	for seq, at := range n.readIssuedAt {
		if n.ticks-at < n.cfg.ElectionTicks {
			continue
		}
		n.readPending = append(n.readInFlight[seq], n.readPending...)
		delete(n.readInFlight, seq)
		delete(n.readIssuedAt, seq)
	}
	n.issueReadIndex()
}

func (n *Node) handleApplied(idx uint64) {
	if idx > n.applied {
		n.applied = idx
	}
	if n.flushing || n.cfg.Engine == nil || n.applied-n.compactedTo < n.cfg.SnapshotCount+n.cfg.CatchUpEntries {
		return
	}
	n.flushing = true
	n.flushes.Add(1)
	go func() {
		defer n.flushes.Done()
		// Flushing may take a while; it runs off the node goroutine and
		// reports the durable index it reached.
		if err := n.cfg.Engine.Flush(); err != nil {
			n.logger.Error("engine flush failed; log not compacted", zap.Error(err))
			select {
			case n.flushc <- 0:
			case <-n.done:
			}
			return
		}
		select {
		case n.flushc <- n.cfg.Engine.DurableIndex():
		case <-n.done:
		}
	}()
}

// compactLog drops log entries that the engine holds durably, keeping
// CatchUpEntries below the durable index for followers.
func (n *Node) compactLog(durable uint64) error {
	if durable <= n.cfg.CatchUpEntries {
		return nil
	}
	to := durable - n.cfg.CatchUpEntries
	// The engine may be ahead of the log's last index after a snapshot
	// install (a full snapshot carries the leader's engine past the
	// snapshot's index): never compact past what the log holds.
	to = min(to, n.lastIdx.Load())
	if to <= n.compactedTo {
		return nil
	}
	cs := n.confStateAt(to)
	if cs == nil {
		return nil
	}
	if err := n.cfg.Log.Compact(to, cs); errors.Is(err, raft.ErrCompacted) {
		// Log compaction into batch files already moved the log's
		// snapshot point past to (raftlog/compactlog.go).
		n.compactedTo = to
		return nil
	} else if err != nil {
		return fmt.Errorf("compact raft log to %d: %w", to, err)
	}
	n.compactedTo = to
	n.firstIdx.Store(to + 1)
	n.logger.Debug("compacted raft log", zap.Uint64("to", to), zap.Uint64("durable", durable))
	return nil
}

// confStateAt returns the membership in force at index, and forgets the
// history before it that no later compaction will need.
func (n *Node) confStateAt(index uint64) *raftpb.ConfState {
	var cs *raftpb.ConfState
	keep := 0
	for i, c := range n.confHistory {
		if c.index <= index {
			cs, keep = c.cs, i
		}
	}
	n.confHistory = n.confHistory[keep:]
	if cs == nil {
		return n.lastConfState
	}
	return cs
}

// raftLogger adapts zap to raft's Logger.
type raftLogger struct{ *zap.SugaredLogger }

func (l *raftLogger) Warning(v ...interface{})                 { l.Warn(v...) }
func (l *raftLogger) Warningf(format string, v ...interface{}) { l.Warnf(format, v...) }
