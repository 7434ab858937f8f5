package logger

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/membership/memberlist"
)

// Log is what a learner needs of its raft log: raft's reads, the durable
// append, the restart after a snapshot, and the size for Status.
// *raftlog.Log implements it.
type Log interface {
	raft.Storage
	// Append durably writes entries and the HardState with one sync.
	Append(entries []*raftpb.Entry, hs *raftpb.HardState) error
	// ApplySnapshot discards the log and restarts it after the snapshot.
	ApplySnapshot(meta *raftpb.SnapshotMetadata) error
	// Compact drops the entries <= index (Truncate); nil keeps the conf
	// state.
	Compact(index uint64, cs *raftpb.ConfState) error
}

// compactedLog is the part of *raftlog.Log that log compaction adds: the
// range its compacted batch files stand for (n == 0: none).
type compactedLog interface {
	CompactedRange() (first, last uint64, n int)
}

// Sender sends raft messages to peers without blocking (transport.Transport).
type Sender interface {
	Send(msgs []*raftpb.Message)
}

// Peers is what the learner changes in its transport when a membership
// change adds, moves or removes a member (transport.Transport).
type Peers interface {
	AddPeer(id uint64, urls []string)
	UpdatePeer(id uint64, urls []string)
	RemovePeer(id uint64)
}

// Inbox is the learner's side of the transport: the transport.Handler that
// queues what peers send for the learner's goroutine, and the
// transport.Snapshotter that reads and discards a snapshot's data (a logger
// has no state machine to install it in; the MsgSnap itself goes to raft,
// which restarts the log after it: the gap). It is built before the
// transport, and the learner after both, so that nothing is set after
// construction.
//
// Concurrency: all methods are safe from any goroutine.
type Inbox struct {
	recvc chan *raftpb.Message
	ctrlc chan func(*raft.RawNode)
	// leaderCommit is the highest commit index a leader announced in an
	// append (MsgApp.Commit): the lag Status reports is measured from it.
	leaderCommit atomic.Uint64
	// heard is when a leader's message (an append, a heartbeat, a
	// snapshot) last arrived, in Unix nanoseconds by now; 0: never.
	heard atomic.Int64
	now   func() time.Time
}

// NewInbox returns an empty inbox.
func NewInbox() *Inbox {
	return &Inbox{recvc: make(chan *raftpb.Message, 4096), ctrlc: make(chan func(*raft.RawNode), 64), now: time.Now}
}

// lastHeard is when a leader's message last arrived; zero if none did.
func (in *Inbox) lastHeard() time.Time {
	if ns := in.heard.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Process implements transport.Handler: it queues m for the learner,
// waiting while the queue is full (the learner is syncing).
func (in *Inbox) Process(ctx context.Context, m *raftpb.Message) error {
	switch m.GetType() {
	case raftpb.MessageType_MsgApp, raftpb.MessageType_MsgHeartbeat, raftpb.MessageType_MsgSnap:
		// Only a leader sends these (/health).
		in.heard.Store(in.now().UnixNano())
	}
	if m.GetType() == raftpb.MessageType_MsgApp {
		for {
			old := in.leaderCommit.Load()
			if m.GetCommit() <= old || in.leaderCommit.CompareAndSwap(old, m.GetCommit()) {
				break
			}
		}
	}
	select {
	case in.recvc <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ReportUnreachable implements transport.Handler.
func (in *Inbox) ReportUnreachable(id uint64) {
	select {
	case in.ctrlc <- func(rn *raft.RawNode) { rn.ReportUnreachable(id) }:
	default:
	}
}

// ReportSnapshot implements transport.Handler. A logger sends no snapshot,
// so nothing reports one; it is passed to raft all the same.
func (in *Inbox) ReportSnapshot(id uint64, st raft.SnapshotStatus) {
	select {
	case in.ctrlc <- func(rn *raft.RawNode) { rn.ReportSnapshot(id, st) }:
	default:
	}
}

// errNoSnapshots is what a logger answers when asked to send a snapshot.
var errNoSnapshots = errors.New("logger: a logger sends no snapshots")

// Open implements transport.Snapshotter: a logger never sends snapshots
// (it is never a leader).
func (in *Inbox) Open(m *raftpb.Message) (io.ReadCloser, error) { return nil, errNoSnapshots }

// Receive implements transport.Snapshotter: it reads the snapshot's data to
// its end and keeps nothing.
func (in *Inbox) Receive(m *raftpb.Message, r io.Reader) error {
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fmt.Errorf("logger: read snapshot at index %d: %w", m.GetSnapshot().GetMetadata().GetIndex(), err)
	}
	return nil
}

// learnerConfig configures a learner.
type learnerConfig struct {
	Record *ClusterRecord
	// Dir is the cluster's directory (record, gap record); Log its
	// raftlog, opened; Gaps the gap record read at open, reconciled.
	Dir  string
	FS   vfs.FS
	Log  Log
	Gaps []Gap
	// Inbox receives what the transport hands over; Sender and Peers are
	// the cluster's transport.
	Inbox  *Inbox
	Sender Sender
	Peers  Peers
	// TickInterval paces the writes of a newer commit index (at most one
	// per tick) and the publishing of the attributes. raft itself is never
	// ticked: its only use of a tick on a follower is the election timer
	// (invariant 3).
	TickInterval time.Duration
	// Attributes, if not nil, are published in the cluster's member list
	// (publish.go) until the learner sees them committed.
	Attributes *Attributes
	Now        func() time.Time
	Logger     *zap.Logger
}

// learner is one cluster's raft learner: it persists every entry the leader
// sends before it acknowledges it, and does nothing else with it
// (docs/logger.md).
//
// Concurrency: newLearner starts nothing; run is the learner's goroutine,
// the only one that touches rn, writes the log, the gap record and the
// cluster record, and the only one that proposes (invariant 5). gaps,
// voters, requestTrim, the fields marked "Published by run" and the metrics'
// counters are safe from any goroutine; mu guards gaps and voters.
//
// Invariants:
//  1. A Ready's messages are sent only after its entries and HardState
//     returned from Log.Append (durable): an acknowledged entry survives a
//     crash.
//  2. A snapshot restarts the log (Log.ApplySnapshot) before the Ready's
//     entries are appended, and the gap is recorded before the Ready's
//     messages are sent; a crash between the restart and the record is
//     repaired at open (reconcileGaps).
//  3. The log is truncated only by a snapshot's restart and by Truncate,
//     never past the voters' truncation point, the commit index, or the
//     last committed entry raft handed over; nothing is applied.
//  4. commit (published) never exceeds the last index appended durably, so
//     Recover serves only durable, committed entries.
//  5. The only proposal the learner makes is its own attributes (a
//     ClusterMemberAttrSet for its member ID, publish.go), forwarded by raft
//     to the leader, and only until it sees them committed.
//  6. The learner never campaigns and never votes, even if an operator
//     promoted it to a voter before it published the mark that forbids
//     it (memberlist.IsLogger): its raft is never ticked, so its election
//     timer never fires, and vote requests and MsgTimeoutNow are dropped
//     unread. A promoted logger counts in the quorum as a voter that is
//     down for elections.
//  7. A committed membership change reaches the cluster record (peers,
//     voters) before the HardState that commits it is durable: raft
//     redelivers no committed entry after a restart (nothing is applied),
//     so a crash between the two would lose the change for good. Written
//     first, a change whose commit was not yet durable is met again and
//     followed again, which changes nothing. A record that cannot be
//     written stops the learner.
type learner struct {
	cfg learnerConfig
	lg  *zap.Logger
	rn  *raft.RawNode // owned by run

	// Owned by run.
	hs              *raftpb.HardState // the latest raft reported
	persistedCommit uint64
	// delivered is the last committed entry raft handed over (and so
	// will not read again): truncation never passes it, or raft would
	// find the entries it still has to hand over gone.
	delivered uint64
	// trimmedTo is the last truncation done.
	trimmedTo uint64
	peers     map[uint64][]string
	// removed are the member IDs the cluster removed (cluster.json's),
	// sorted.
	removed []uint64
	// publishedAttrs are the attributes last seen committed for the
	// logger (cluster.json's); published says they are cfg.Attributes.
	// lastPublish and publishID are the last proposal's time and request
	// ID (publish.go).
	publishedAttrs *Attributes
	published      bool
	lastPublish    time.Time
	publishID      uint64

	// Published by run.
	commit atomic.Uint64
	// deliveredIndex is delivered, published for the compactor
	// (compaction.go): it never compacts past it.
	deliveredIndex atomic.Uint64
	leader         atomic.Uint64
	// Counted by run for the metrics (metrics.go): entries and bytes of
	// entry data appended, truncations done since start.
	entriesLogged atomic.Uint64
	bytesLogged   atomic.Uint64
	truncations   atomic.Uint64

	// trimTo is the truncation point the Truncate requests reached
	// (truncate.go); trimc wakes run to truncate up to it.
	trimTo atomic.Uint64
	trimc  chan struct{}

	mu struct {
		sync.Mutex
		gaps []Gap
		// voters are the cluster's voters, as the membership changes
		// the learner saw say.
		voters map[uint64]bool
	}
}

func newLearner(cfg learnerConfig) (*learner, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	hs, _, err := cfg.Log.InitialState()
	if err != nil {
		return nil, fmt.Errorf("read the log's state: %w", err)
	}
	first, err := cfg.Log.FirstIndex()
	if err != nil {
		return nil, fmt.Errorf("read first log index: %w", err)
	}
	// Nothing is applied, so nothing is to be redelivered: raft starts as
	// if everything committed were applied.
	applied := max(hs.GetCommit(), first-1)
	rn, err := raft.NewRawNode(&raft.Config{
		ID:              cfg.Record.MemberID,
		ElectionTick:    10,
		HeartbeatTick:   1,
		Storage:         cfg.Log,
		Applied:         applied,
		MaxSizePerMsg:   1 << 20,
		MaxInflightMsgs: 256,
		PreVote:         true,
		Logger:          &raftLogger{cfg.Logger.Sugar()},
	})
	if err != nil {
		return nil, fmt.Errorf("create raft learner: %w", err)
	}
	l := &learner{
		cfg:             cfg,
		lg:              cfg.Logger,
		rn:              rn,
		hs:              hs,
		persistedCommit: hs.GetCommit(),
		delivered:       applied,
		peers:           maps.Clone(cfg.Record.Peers),
		removed:         slices.Clone(cfg.Record.Removed),
		trimc:           make(chan struct{}, 1),
		publishedAttrs:  cfg.Record.Published,
		published:       cfg.Attributes.equal(cfg.Record.Published),
	}
	if l.peers == nil {
		l.peers = map[uint64][]string{}
	}
	l.commit.Store(applied)
	l.deliveredIndex.Store(applied)
	l.mu.gaps = cfg.Gaps
	l.mu.voters = map[uint64]bool{}
	for _, v := range cfg.Record.Voters {
		l.mu.voters[v] = true
	}
	return l, nil
}

// run drives the learner until ctx ends or a write fails; a write error (a
// failed fsync above all) is returned and is fatal for this cluster.
func (l *learner) run(ctx context.Context) error {
	err := l.loop(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	l.lg.Error("learner stopped", zap.Error(err))
	return err
}

func (l *learner) loop(ctx context.Context) error {
	ticker := time.NewTicker(l.cfg.TickInterval)
	defer ticker.Stop()
	in := l.cfg.Inbox
	if err := l.trim(); err != nil {
		return err
	}
	for {
		if l.rn.HasReady() {
			if err := l.handleReady(); err != nil {
				return err
			}
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
			if err := l.tick(); err != nil {
				return err
			}
		case m := <-in.recvc:
			l.step(m)
			// One Ready, and so one fsync, for every message queued.
		drain:
			for i := 0; i < 4096; i++ {
				select {
				case m := <-in.recvc:
					l.step(m)
				default:
					break drain
				}
			}
		case f := <-in.ctrlc:
			f(l.rn)
		case <-l.trimc:
			if err := l.trim(); err != nil {
				return err
			}
		}
	}
}

// tick is the loop's periodic work: a newer commit index written, the
// attributes published. raft itself is not ticked (invariant 6).
func (l *learner) tick() error {
	if err := l.persistCommit(); err != nil {
		return err
	}
	l.maybePublish()
	return nil
}

func (l *learner) step(m *raftpb.Message) {
	switch m.GetType() {
	case raftpb.MsgVote, raftpb.MsgPreVote, raftpb.MsgTimeoutNow:
		return // invariant 6
	}
	if err := l.rn.Step(m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
		l.lg.Debug("raft refused a message", zap.Stringer("type", m.GetType()), zap.Error(err))
	}
}

// handleReady performs one Ready in raft's order: the snapshot (the gap),
// the committed membership changes, the entries and HardState with one
// sync, the messages, Advance; then the truncation the voters asked for,
// if the commit index now reaches more of it.
func (l *learner) handleReady() error {
	rd := l.rn.Ready()
	if rd.SoftState != nil {
		l.leader.Store(rd.SoftState.Lead)
	}
	if rd.Snapshot != nil && !raft.IsEmptySnap(rd.Snapshot) {
		if err := l.restartAfter(rd.Snapshot.GetMetadata()); err != nil {
			return err
		}
	}
	// Invariant 7: the cluster record follows a membership change before
	// the HardState that commits it is durable.
	for _, e := range rd.CommittedEntries {
		if e.GetType() == raftpb.EntryConfChange || e.GetType() == raftpb.EntryConfChangeV2 {
			if err := l.followMembership(e); err != nil {
				return fmt.Errorf("follow the membership change at %d of cluster %x: %w", e.GetIndex(), l.cfg.Record.ClusterID, err)
			}
		}
	}
	var hs *raftpb.HardState
	if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
		l.hs = rd.HardState
		if rd.MustSync {
			hs = rd.HardState
		}
	}
	if len(rd.Entries) > 0 && hs == nil {
		hs = l.hs
	}
	if len(rd.Entries) > 0 || hs != nil {
		if err := l.cfg.Log.Append(rd.Entries, hs); err != nil {
			return fmt.Errorf("append to the raft log of cluster %x: %w", l.cfg.Record.ClusterID, err)
		}
		if hs != nil {
			l.persistedCommit = hs.GetCommit()
		}
		var n uint64
		for _, e := range rd.Entries {
			n += uint64(len(e.GetData()))
		}
		l.entriesLogged.Add(uint64(len(rd.Entries)))
		l.bytesLogged.Add(n)
	}
	// Invariant 4: publish the commit index once what it covers is
	// durable (raft's commit on a follower never passes its last entry).
	if l.hs != nil {
		l.publishCommit(l.hs.GetCommit())
	}
	// Invariant 1: the acknowledgements leave after the sync.
	if len(rd.Messages) > 0 {
		l.cfg.Sender.Send(rd.Messages)
	}
	if n := len(rd.CommittedEntries); n > 0 {
		l.delivered = rd.CommittedEntries[n-1].GetIndex()
		l.deliveredIndex.Store(l.delivered)
	}
	if err := l.notePublished(rd.CommittedEntries); err != nil {
		return err
	}
	l.rn.Advance(rd)
	// A truncation point past the commit index waited for it.
	return l.trim()
}

func (l *learner) publishCommit(c uint64) {
	if last, err := l.cfg.Log.LastIndex(); err == nil {
		c = min(c, last)
	}
	if c > l.commit.Load() {
		l.commit.Store(c)
	}
}

// restartAfter restarts the log after a snapshot the leader sent and
// records the gap (invariant 2).
func (l *learner) restartAfter(meta *raftpb.SnapshotMetadata) error {
	first, _ := l.cfg.Log.FirstIndex()
	last, _ := l.cfg.Log.LastIndex()
	batches := false
	if cr, ok := l.cfg.Log.(compactedLog); ok {
		if cf, cl, n := cr.CompactedRange(); n > 0 {
			batches = true
			if cl >= first-1 {
				first = cf // the compacted batches were held too
			}
		}
	}
	if err := l.cfg.Log.ApplySnapshot(meta); err != nil {
		return fmt.Errorf("restart the raft log of cluster %x after the snapshot at %d: %w", l.cfg.Record.ClusterID, meta.GetIndex(), err)
	}
	// The compacted batches, all below the snapshot, go too: Compact drops
	// the batch files at or below its index before it finds the index at
	// the snapshot point.
	if batches {
		if err := l.cfg.Log.Compact(meta.GetIndex(), nil); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return fmt.Errorf("drop the compacted batches of cluster %x below the snapshot at %d: %w", l.cfg.Record.ClusterID, meta.GetIndex(), err)
		}
	}

	g := Gap{SnapshotIndex: meta.GetIndex(), SnapshotTerm: meta.GetTerm(), At: l.cfg.Now().UTC()}
	if last >= first {
		g.DiscardedFirst, g.DiscardedLast = first, last
	}
	l.mu.Lock()
	gaps := append(l.mu.gaps[:len(l.mu.gaps):len(l.mu.gaps)], g)
	l.mu.Unlock()
	if err := writeGaps(l.cfg.FS, l.cfg.Dir, gaps); err != nil {
		return fmt.Errorf("record the gap of cluster %x: %w", l.cfg.Record.ClusterID, err)
	}
	l.mu.Lock()
	l.mu.gaps = gaps
	l.mu.Unlock()
	l.commit.Store(max(l.commit.Load(), meta.GetIndex()))
	l.delivered = max(l.delivered, meta.GetIndex())
	l.deliveredIndex.Store(l.delivered)
	l.lg.Warn("the leader sent a snapshot: the logger holds the log only after it", zap.Stringer("gap", g))
	return nil
}

// persistCommit writes the latest HardState if its commit index is newer
// than the one in the log: at most one small synced write per tick.
func (l *learner) persistCommit() error {
	if l.hs == nil || l.hs.GetCommit() <= l.persistedCommit {
		return nil
	}
	if err := l.cfg.Log.Append(nil, l.hs); err != nil {
		return fmt.Errorf("persist the commit index of cluster %x: %w", l.cfg.Record.ClusterID, err)
	}
	l.persistedCommit = l.hs.GetCommit()
	return nil
}

// followMembership keeps the transport's peers and the cluster record in
// step with a committed membership change (the pb.Member it carries).
// raft's own configuration is left alone (docs/logger.md).
func (l *learner) followMembership(e *raftpb.Entry) error {
	c, err := memberlist.DecodeChange(e)
	if err != nil {
		return err
	}
	// The members check each change again as it applies and hand raft no
	// change for a refused one (memberlist); the logger follows their
	// decision as far as what it keeps tells it: the peers, the voters and
	// the removed IDs. It cannot tell a change refused for the learner
	// limit (each member's flag), and follows it: a learner more among its
	// peers. Without this it counted, say, a retried addition that reused a
	// peer URL as a voter whose Truncate never comes, and never truncated.
	// A change whose effect its record already holds is followed, not
	// checked: a logger that joined late reads the cluster's history from
	// the start against a record of the cluster as it joined it.
	if refused := l.memberList().Check(c, math.MaxInt); refused != nil && !l.holds(c) {
		l.lg.Info("not following a membership change the members refuse", zap.Uint64("index", e.GetIndex()), zap.Error(refused))
		return nil
	}
	var urls []string
	if c.Member != nil {
		urls = c.Member.PeerURLs
	}
	changed := false
	for _, ch := range c.Changes {
		id := ch.GetNodeId()
		if id == l.cfg.Record.MemberID {
			if ch.GetType() == raftpb.ConfChangeRemoveNode {
				l.lg.Warn("the cluster removed this logger; it keeps what it holds and receives nothing more",
					zap.String("cluster-id", fmt.Sprintf("%x", l.cfg.Record.ClusterID)))
			}
			continue
		}
		switch ch.GetType() {
		case raftpb.ConfChangeAddNode:
			l.setVoter(id, true)
			changed = true
		case raftpb.ConfChangeAddLearnerNode:
			l.setVoter(id, false)
			changed = true
		case raftpb.ConfChangeRemoveNode:
			l.setVoter(id, false)
			if i, found := slices.BinarySearch(l.removed, id); !found {
				l.removed = slices.Insert(l.removed, i, id)
			}
			changed = true
		}
		switch ch.GetType() {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode, raftpb.ConfChangeUpdateNode:
			if len(urls) == 0 {
				continue
			}
			if _, known := l.peers[id]; known {
				l.cfg.Peers.UpdatePeer(id, urls)
			} else {
				l.cfg.Peers.AddPeer(id, urls)
			}
			l.peers[id] = urls
			changed = true
		case raftpb.ConfChangeRemoveNode:
			if _, known := l.peers[id]; known {
				l.cfg.Peers.RemovePeer(id)
				delete(l.peers, id)
				changed = true
			}
		}
	}
	if !changed {
		return nil
	}
	return writeRecord(l.cfg.FS, l.cfg.Dir, l.record())
}

// holds says whether the learner's record already reflects c: a voter
// added that is a voter, a learner added that is a peer and not a voter.
//
// REQUIRES: the learner's goroutine.
func (l *learner) holds(c memberlist.Change) bool {
	if len(c.Changes) != 1 {
		return false
	}
	id := c.Changes[0].GetNodeId()
	_, peer := l.peers[id]
	voter := slices.Contains(l.voters(), id)
	switch c.Changes[0].GetType() {
	case raftpb.ConfChangeAddNode:
		return voter
	case raftpb.ConfChangeAddLearnerNode:
		return peer && !voter
	}
	return false
}

// memberList is the cluster's member list as far as the learner keeps it:
// its peers (learners unless voters) and itself, with their peer URLs, and
// the removed IDs.
//
// REQUIRES: the learner's goroutine.
func (l *learner) memberList() *memberlist.List {
	voters := l.voters()
	list := &memberlist.List{Removed: l.removed,
		Members: []*pb.Member{{ID: l.cfg.Record.MemberID, PeerURLs: l.cfg.Record.PeerURLs, IsLearner: true}}}
	for id, urls := range l.peers {
		list.Members = append(list.Members, &pb.Member{ID: id, PeerURLs: urls, IsLearner: !slices.Contains(voters, id)})
	}
	for _, id := range voters {
		if _, ok := l.peers[id]; !ok {
			list.Members = append(list.Members, &pb.Member{ID: id})
		}
	}
	slices.SortFunc(list.Members, func(a, b *pb.Member) int { return cmp.Compare(a.ID, b.ID) })
	return list
}

// record is the cluster record as the learner knows it now: the peers and
// voters of the membership changes it saw, the attributes it published.
//
// REQUIRES: the learner's goroutine.
func (l *learner) record() *ClusterRecord {
	rec := *l.cfg.Record
	rec.Peers = maps.Clone(l.peers)
	rec.Voters = l.voters()
	rec.Removed = slices.Clone(l.removed)
	rec.Published = l.publishedAttrs
	return &rec
}

// gaps returns the gaps recorded, oldest first.
func (l *learner) gaps() []Gap {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Gap(nil), l.mu.gaps...)
}

// reconcileGaps records the gap of a snapshot whose log restart a crash
// separated from its record (invariant 2): the log's snapshot point is
// above the last gap recorded and above truncatedTo, the truncation point
// recorded (a truncation moves the snapshot point too, and is no gap).
func reconcileGaps(fs vfs.FS, dir string, log Log, gaps []Gap, truncatedTo uint64, now time.Time) ([]Gap, error) {
	first, err := log.FirstIndex()
	if err != nil {
		return nil, err
	}
	point := first - 1
	if cr, ok := log.(compactedLog); ok {
		if _, cl, n := cr.CompactedRange(); n > 0 && cl == point {
			// Log compaction moved the snapshot point: no gap.
			return gaps, nil
		}
	}
	var recorded uint64
	if len(gaps) > 0 {
		recorded = gaps[len(gaps)-1].SnapshotIndex
	}
	if point == 0 || point <= recorded || point <= truncatedTo {
		return gaps, nil
	}
	term, err := log.Term(point)
	if err != nil {
		return nil, fmt.Errorf("read the term at the log's snapshot point %d: %w", point, err)
	}
	gaps = append(gaps, Gap{SnapshotIndex: point, SnapshotTerm: term, Reconciled: true, At: now.UTC()})
	if err := writeGaps(fs, dir, gaps); err != nil {
		return nil, err
	}
	return gaps, nil
}

// raftLogger adapts zap to raft's Logger.
type raftLogger struct{ *zap.SugaredLogger }

func (r *raftLogger) Warning(v ...interface{}) { r.Warn(v...) }

func (r *raftLogger) Warningf(format string, v ...interface{}) { r.Warnf(format, v...) }
