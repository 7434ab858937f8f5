// Package node owns strata's raft state machine: one goroutine drives a
// go.etcd.io/raft/v3 RawNode and performs, for every Ready, the steps the raft
// library asks of its caller, in the order it requires:
//
//  1. persist the Ready's entries and HardState to the raft log, with one
//     fsync (group commit: every proposal and peer message that arrived
//     since the last Ready shares that sync, and a leader holds the Ready,
//     briefly, for client writes it knows are on their way: incoming.go);
//  2. hand the Ready's messages to the transport on Outgoing, after the
//     entries they acknowledge are durable (a leader hands them over before
//     its own fsync, as etcd does);
//  3. answer ReadIndex requests whose read state arrived;
//  4. hand the committed entries to the applier, which applies them to the
//     state machine on its own goroutine so that applying batch N overlaps
//     with syncing batch N+1; a membership change among them is applied to
//     raft only once the applier, having applied every entry before it,
//     says the change applies (a refused one reaches raft as no change:
//     deliver), as etcd's raft loop waits for its applier on a change;
//  5. Advance.
//
// Before the loop, New may rewrite the log once: with Config.ForceNewCluster
// (etcd's --force-new-cluster) it appends, durably, committed membership
// entries that remove every other member (force.go), which the loop then
// applies like any others.
//
// The node also keeps the log short (docs/design.md, durability rule 4): once
// enough entries have been applied it asks the engine to flush, and when the
// flush reports a durable index D it compacts the log up to D (less a
// catch-up margin kept for slow followers). With LogKeepers (a member's
// --logger-retention, Config.LogRetention) a leader also keeps every entry
// a keeper (a strata logger, KeepLogFor) has not acknowledged (truncate.go).
//
// # Files
//
//	node.go       the types, New, and the Ready loop (the steps above)
//	propose.go    proposals and the other requests other goroutines send the loop
//	incoming.go   the count of client writes on their way, which group commit waits for
//	readindex.go  linearizable reads: batched ReadIndex requests and their answers
//	truncate.go   the applied index, engine flushes and log truncation (step 4's sequel)
//	snapshot.go   snapshot install, the pending-snapshot record, restart storage
//	force.go      --force-new-cluster: the log rewritten, before raft starts,
//	              so that this member is its cluster's only voter
//	catchup.go    committed entries from a strata logger handed to raft as the
//	              leader's append (--catch-up-logger, a running member behind)
//
// The Ready contract is tested by scripts in testdata/ (interaction_test.go):
// each drives nodes one Ready at a time and shows their I/O in order.
//
// Concurrency: New starts nothing; Run is the node goroutine, the only one
// that touches the RawNode and writes the log. Propose, ReadIndex, Status and
// the accessors are safe from any goroutine.
package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
	// Decide, when set, is a committed membership change the node asks
	// the applier about before it applies the change to raft (Entries is
	// empty): the applier answers on Decision, once it has applied every
	// entry handed to it before, with why the change is refused (nil: it
	// applies). A refused change reaches raft as a change of node 0, which
	// raft ignores. The entry itself follows in the next batch.
	Decide   *raftpb.Entry
	Decision chan<- error
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
	// SnapshotBytes and CatchUpBytes are SnapshotCount and CatchUpEntries
	// in bytes of entries: a flush and truncation also start once
	// SnapshotBytes+CatchUpBytes were appended past the last truncation
	// (and SnapshotBytes past the last flush), and the margin kept below
	// the durable index is at most CatchUpBytes (but never more entries
	// than CatchUpEntries). Without them a log of large entries (a bulk
	// load's batches) grows to 15,000 of them, hundreds of MiB, before it
	// is truncated (docs/bench/report-20261128.md, "Where the disk after a load
	// goes"). 0 means DefaultSnapshotBytes and DefaultCatchUpBytes.
	SnapshotBytes, CatchUpBytes uint64
	// MaxSizePerMsg and MaxInflightMsgs bound replication traffic.
	MaxSizePerMsg   uint64
	MaxInflightMsgs int
	// DisablePreVote turns raft's PreVote off (etcd's --pre-vote=false);
	// PreVote is on by default, as in etcd.
	DisablePreVote bool
	// ForceNewCluster is etcd's --force-new-cluster: on a log that holds
	// state, the member becomes its cluster's only voter before raft starts
	// (force.go). On an empty log it is ignored, as etcd ignores it without
	// a WAL: the member bootstraps (Peers) or joins (Join).
	ForceNewCluster bool
	// ClusterID is named in the log lines of ForceNewCluster.
	ClusterID uint64
	// ServerLogger logs ForceNewCluster's lines, which etcd's server (not
	// its raft) prints, so that they carry no "raft" logger name; nil
	// means Logger.
	ServerLogger *zap.Logger
	// LogRetention (a member's --logger-retention) keeps the log for the
	// members KeepLogFor names (the cluster's strata loggers): never
	// truncated past the lowest index one of them acknowledged (on the
	// leader) or is known to hold (on a follower, LoggersHeld); see
	// truncate.go.
	LogRetention bool
	// MatchedIndex, if not 0, is an index up to which this member's log
	// holds the cluster's committed entries because it copied them before
	// raft started (a member's --catch-up-logger, logger.CatchUp). The
	// leader does not know it: its progress for a member that was down may
	// point below the start of its own truncated log, and it would answer
	// the member's first heartbeat response with a snapshot. So the node
	// tells the first leader it hears what raft's leader takes from a
	// follower whose log matches its own up to an index: a MsgAppResp
	// for MatchedIndex, handed to the transport ahead of the messages of
	// that Ready. It is true of any leader the member follows: the
	// message carries the leader's term, which is at least the term of
	// every copied entry (CatchUp keeps the HardState's term there), and
	// a leader of that term holds every entry committed before it.
	MatchedIndex uint64
	// Incoming counts the client API's write requests on their way to
	// Propose; a leader holds an append for them up to IncomingWait
	// (incoming.go). Nil waits for nothing; 0 means DefaultIncomingWait.
	Incoming     *Incoming
	IncomingWait time.Duration
	Logger       *zap.Logger
}

// Node drives raft. See the package comment.
type Node struct {
	cfg    Config
	logger *zap.Logger
	rn     *raft.RawNode // owned by the Run goroutine

	propc    chan proposal
	recvc    chan *raftpb.Message
	ctrlc    chan func(rn *raft.RawNode)
	readc    chan readWaiter
	appliedc chan uint64      // applied index reports from the applier
	flushc   chan flushResult // what a background flush reached
	committc chan Committed
	outgoing chan []*raftpb.Message // messages for the transport (Outgoing)
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
	// keepers are the members the log is kept for (KeepLogFor); held
	// is how far each is known to hold the log committed, as it says
	// (LoggersHeld): a follower's view.
	keepers atomic.Pointer[[]uint64]
	held    atomic.Pointer[map[uint64]uint64]
	// kept is keptFor's answer as of the last tick, for LogKeptFor's
	// readers (log compaction); nil until the first tick.
	kept     atomic.Pointer[keptIndex]
	leaderCh atomic.Pointer[chan struct{}] // closed when a leader is known
	stopErr  atomic.Pointer[error]
	// leaderChanges counts the times a new leader became known (metrics).
	leaderChanges atomic.Uint64
	// incomingWaits counts the appends held for writes on their way, and
	// incomingTimeouts those holds that ran to their bound (metrics).
	incomingWaits, incomingTimeouts atomic.Uint64
	// lastTick is when the raft loop last ticked (Unix nanoseconds).
	lastTick atomic.Int64

	// State of the Run goroutine only.
	// announceMatch is Config.MatchedIndex until the leader was told.
	announceMatch uint64
	// readSeq numbers ReadIndex rounds; it starts at a random value, so
	// that a leader's answer to a round of this member's previous run
	// (same term, a restart within an election timeout) cannot be taken
	// for the answer to a round of this one, as raft leaves the request
	// context's uniqueness to the caller.
	readSeq      uint64
	readPending  []readWaiter            // waiting for the next ReadIndex round
	readInFlight map[uint64][]readWaiter // round context -> waiters
	readIssuedAt map[uint64]int          // round context -> tick it was issued at
	ticks        int
	// incomingWait is Config.IncomingWait or its default; incomingTimer
	// bounds awaitIncoming, nil until its first wait.
	incomingWait  time.Duration
	incomingTimer *time.Timer
	applied       uint64 // highest index the applier reported
	// pendingUntil, if not 0, is the state machine's applied index after a
	// snapshot install, which may be past the log's last index: the
	// install's record (Log.BeginSnapshot) stays until the log's last
	// index reaches it, so that a restart before then accepts an engine
	// past the log's end (reconcileSnapshot). Once the log holds every
	// entry the engine applied, it always will: entries are appended
	// before they are applied.
	pendingUntil uint64
	compactedTo  uint64 // log compacted up to here
	logSize      logSize
	flushing     bool
	// flushedAt is the applied index when the last flush started: a
	// truncation held back by LogKeepers waits SnapshotCount more applied
	// entries before the next flush, rather than flushing on every report.
	flushedAt       uint64
	confHistory     []confAt // conf states by index, for log compaction points
	lastConfState   *raftpb.ConfState
	hardState       *raftpb.HardState // the latest raft reported
	persistedCommit uint64            // commit index of the last HardState written
}

type confAt struct {
	index uint64
	cs    *raftpb.ConfState
}

// New creates a node over an opened log. It starts no goroutine.
func New(cfg Config) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.ServerLogger == nil {
		cfg.ServerLogger = cfg.Logger
	}
	if cfg.SnapshotCount == 0 {
		cfg.SnapshotCount = 10000
	}
	if cfg.SnapshotBytes == 0 {
		cfg.SnapshotBytes = DefaultSnapshotBytes
	}
	if cfg.CatchUpBytes == 0 {
		cfg.CatchUpBytes = DefaultCatchUpBytes
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
		PreVote:                   !cfg.DisablePreVote,
		Logger:                    &raftLogger{cfg.Logger.Sugar()},
	}
	last, err := cfg.Log.LastIndex()
	if err != nil {
		return nil, fmt.Errorf("read last log index: %w", err)
	}
	if cfg.Applied > last && last == 0 {
		// Nothing in the log at all: far likelier a log directory other than
		// the one the data was written with than a log that lost entries.
		return nil, fmt.Errorf("engine applied index %d but the raft log is empty: is this the log directory (--log-dir, --wal-dir) the member wrote its log to, or was it deleted?", cfg.Applied)
	}
	if cfg.Applied > last {
		return nil, fmt.Errorf("engine applied index %d is past the log's last index %d: the log lost synced entries", cfg.Applied, last)
	}
	if cfg.ForceNewCluster && last > 0 {
		if last, err = forceNewCluster(cfg, raftApplied, pendingUntil); err != nil {
			return nil, err
		}
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
		announceMatch: cfg.MatchedIndex,
		rn:            rn,
		incomingWait:  cmp.Or(cfg.IncomingWait, DefaultIncomingWait),
		propc:         make(chan proposal, 1024),
		recvc:         make(chan *raftpb.Message, 4096),
		ctrlc:         make(chan func(*raft.RawNode), 64),
		readc:         make(chan readWaiter, 1024),
		appliedc:      make(chan uint64, 16),
		flushc:        make(chan flushResult, 1),
		committc:      make(chan Committed, 64),
		outgoing:      make(chan []*raftpb.Message, outgoingBuffer),
		done:          make(chan struct{}),
		readSeq:       rand.Uint64(),
		readInFlight:  map[uint64][]readWaiter{},
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

// Committed returns the channel of committed entry batches. The applier
// must drain it and report progress with Applied.
func (n *Node) Committed() <-chan Committed { return n.committc }

// Outgoing returns the channel of raft messages the node wants sent, one
// slice per hand-off, in the order raft produced them (step 2). The
// transport drains it (transport.Config.Outgoing) and must not block on the
// network while doing so: once outgoingBuffer hand-offs wait unread, the
// node goroutine waits for its reader.
//
// The node exposes what it wants sent instead of calling a transport, so
// that it can be built before the transport, which delivers to it.
func (n *Node) Outgoing() <-chan []*raftpb.Message { return n.outgoing }

// outgoingBuffer is how many hand-offs of messages Outgoing holds unread.
const outgoingBuffer = 1024

// announceMatched puts the MsgAppResp of Config.MatchedIndex ahead of
// msgs once a leader other than this member is known, so that the leader
// handles it before this member's answer to its heartbeat; see
// MatchedIndex for why it is true.
func (n *Node) announceMatched(msgs []*raftpb.Message) []*raftpb.Message {
	lead := n.leader.Load()
	if n.announceMatch == 0 || lead == raft.None || lead == n.cfg.ID {
		return msgs
	}
	resp := &raftpb.Message{Type: raftpb.MessageType_MsgAppResp.Enum(), To: proto.Uint64(lead), From: proto.Uint64(n.cfg.ID),
		Term: proto.Uint64(n.rn.BasicStatus().GetTerm()), Index: proto.Uint64(n.announceMatch)}
	n.logger.Info("told the leader the log entries this member copied before starting",
		zap.String("leader", fmt.Sprintf("%x", lead)), zap.Uint64("matched-index", n.announceMatch))
	n.announceMatch = 0
	return append([]*raftpb.Message{resp}, msgs...)
}

// send hands msgs to the transport (Outgoing).
func (n *Node) send(ctx context.Context, msgs []*raftpb.Message) error {
	select {
	case n.outgoing <- msgs:
		return nil
	case <-ctx.Done():
		return ctx.Err()
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

// Ticking reports whether the raft loop ticked within the last three tick
// intervals (etcd's isActive). A leader whose loop ticks has heard every
// message that would have made it step down, up to a tick ago; one that
// stalled (a disk write that hangs) may have been replaced meanwhile.
func (n *Node) Ticking() bool {
	return time.Since(time.Unix(0, n.lastTick.Load())) < 3*n.cfg.TickInterval
}

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
	n.lastTick.Store(time.Now().UnixNano())
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
			n.lastTick.Store(time.Now().UnixNano())
			n.publishKept()
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
			n.awaitIncoming(ctx)
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
			if err := n.flushDone(d); err != nil {
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
	if n.leader.Load() == n.cfg.ID && len(rd.Messages) > 0 {
		if err := n.send(ctx, rd.Messages); err != nil {
			return err
		}
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
			n.logSize.appended(rd.Entries)
			n.lastIdx.Store(rd.Entries[len(rd.Entries)-1].GetIndex())
			if err := n.forgetPendingSnapshot(); err != nil {
				return err
			}
		}
	}
	// Step 2: messages, after the entries they acknowledge are durable.
	msgs := rd.Messages
	if !sentEarly {
		msgs = n.announceMatched(msgs)
	}
	if !sentEarly && len(msgs) > 0 {
		if err := n.send(ctx, msgs); err != nil {
			return err
		}
	}
	// Step 3: linearizable reads.
	for _, rs := range rd.ReadStates {
		n.answerReads(rs)
	}
	// Step 4: membership, then the applier.
	if len(rd.CommittedEntries) > 0 {
		if err := n.deliver(ctx, rd.CommittedEntries); err != nil {
			return err
		}
	}
	// Step 5.
	n.rn.Advance(rd)
	return nil
}

// deliver hands committed entries to the applier, and applies the
// membership changes among them to raft as the applier decides them: a
// change is checked once more against the member list every entry before
// it produced (package memberlist), so the entries before it go first, and
// the node waits for the applier's answer before it hands raft the change,
// or a change of node 0 in its place, which raft ignores. etcd's raft loop
// waits for its applier in the same way. Raft's configuration and the
// applier's member list thus change together, entry by entry, and raft's
// rule of one pending change at a time (it counts a change as pending
// until Advance) still covers the wait.
func (n *Node) deliver(ctx context.Context, entries []*raftpb.Entry) error {
	from := 0
	for i, e := range entries {
		var cc raftpb.ConfChangeI
		switch e.GetType() {
		case raftpb.EntryConfChange:
			var v1 raftpb.ConfChange
			if err := proto.Unmarshal(e.GetData(), &v1); err != nil {
				return fmt.Errorf("decode conf change at index %d: %w", e.GetIndex(), err)
			}
			if from < i {
				if err := n.handOff(ctx, Committed{Entries: entries[from:i]}); err != nil {
					return err
				}
			}
			refused, err := n.decide(ctx, e)
			if err != nil {
				return err
			}
			if refused != nil {
				n.cfg.Logger.Warn("membership change refused as it applies; raft applies none in its place",
					zap.Uint64("index", e.GetIndex()), zap.Stringer("type", v1.GetType()),
					zap.String("member", fmt.Sprintf("%x", v1.GetNodeId())), zap.Error(refused))
				v1.NodeId = proto.Uint64(0)
			}
			cc = &v1
		case raftpb.EntryConfChangeV2:
			// Neither etcd nor strata proposes one; raft decides it alone
			// (memberlist never refuses one).
			var v2 raftpb.ConfChangeV2
			if err := proto.Unmarshal(e.GetData(), &v2); err != nil {
				return fmt.Errorf("decode conf change at index %d: %w", e.GetIndex(), err)
			}
			if from < i {
				if err := n.handOff(ctx, Committed{Entries: entries[from:i]}); err != nil {
					return err
				}
			}
			cc = &v2
		default:
			continue
		}
		cs := n.rn.ApplyConfChange(cc)
		n.confHistory = append(n.confHistory, confAt{index: e.GetIndex(), cs: cs})
		n.lastConfState = cs
		if err := n.handOff(ctx, Committed{Entries: entries[i : i+1], ConfStates: map[uint64]*raftpb.ConfState{e.GetIndex(): cs}}); err != nil {
			return err
		}
		from = i + 1
	}
	if from < len(entries) {
		return n.handOff(ctx, Committed{Entries: entries[from:]})
	}
	return nil
}

// decide asks the applier whether the committed membership change e
// applies (Committed.Decide) and waits for the answer, taking the
// applier's progress reports meanwhile as handOff does.
func (n *Node) decide(ctx context.Context, e *raftpb.Entry) (refused error, err error) {
	answer := make(chan error, 1)
	if err := n.handOff(ctx, Committed{Decide: e, Decision: answer}); err != nil {
		return nil, err
	}
	for {
		select {
		case refused := <-answer:
			return refused, nil
		case idx := <-n.appliedc:
			n.handleApplied(idx)
		case d := <-n.flushc:
			if err := n.flushDone(d); err != nil {
				return nil, err
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
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
			if err := n.flushDone(d); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// raftLogger adapts zap to raft's Logger.
type raftLogger struct{ *zap.SugaredLogger }

func (l *raftLogger) Warning(v ...interface{}) { l.Warn(v...) }

func (l *raftLogger) Warningf(format string, v ...interface{}) { l.Warnf(format, v...) }
