package logger

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/raftlog"
)

// TestLearnerInteraction runs the scripts in testdata/: deterministic
// interaction tests of the learner's Ready contract (learner.go's
// invariants), in the style of node's. A leader (member 1, a raft RawNode
// over a MemoryStorage, the learner 2 in its configuration) and the
// learner (member 2, over a raftlog on an in-memory file system) are
// driven by hand on the test's goroutine: no timer, no goroutine. The
// output is the trace of their I/O in the order it happened. Rewrite with
// -rewrite, then read: it is the contract.
//
// Commands:
//
//	propose data                  the leader proposes
//	leader-ready                  the leader handles its Readys; its messages wait for deliver
//	deliver                       the learner steps what the leader sent
//	learner-ready                 the learner handles one Ready
//	respond                       the leader steps what the learner sent
//	stabilize                     all of the above until quiet
//	tick-leader                   the leader's clock ticks (a heartbeat)
//	tick-learner n                the learner's clock ticks n times (its loop's ticker)
//	vote-request                  a candidate (member 3, term 99) asks the learner for its vote
//	add-member id [url]           the leader proposes adding a voter (add-learner: a learner;
//	remove-member id              remove-member: removing one), url in its member record
//	truncate index                the voters' truncation point reaches index
//	fail-append                   the learner's next Append fails (its fsync)
//	fail-record                   the learner's next write of cluster.json fails
//	compact-leader index          the leader takes a snapshot at index and truncates its log
//	restart                       the learner's process dies and starts again from its disk
//	publish name url              the learner proposes its attributes (name, client URL) now
//	status                        what the learner holds
func TestLearnerInteraction(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		env := newLearnerEnv(t)
		defer env.close()
		datadriven.RunTest(t, path, env.handle)
	})
}

type learnerEnv struct {
	t *testing.T
	// The leader.
	storage *raft.MemoryStorage
	leader  *raft.RawNode
	// leaderCS is the leader's configuration, as its applied membership
	// changes left it (compact-leader's snapshot carries it).
	leaderCS raftpb.ConfState
	toL      []*raftpb.Message // sent by the leader, not delivered yet
	// The learner.
	fs    *recordFailFS
	log   *recordingLog
	ln    *learner
	rec   *ClusterRecord
	sent  []*raftpb.Message // sent by the learner, not delivered yet
	trace []string
	// truncatedTo is the truncation point the script asked for (the
	// logger keeps it in truncations.json).
	truncatedTo uint64
	// attrs are the attributes the learner publishes (publish).
	attrs *Attributes
}

// recordFailFS is the learner's file system, failing the next write of
// the cluster record on demand. The raft log creates its spare segments on
// a goroutine of its own, through Create too: failNext is atomic.
type recordFailFS struct {
	vfs.FS
	failNext atomic.Bool
}

func (fs *recordFailFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	if strings.Contains(name, recordFile) && fs.failNext.CompareAndSwap(true, false) {
		return nil, errors.New("injected failure to write the cluster record")
	}
	return fs.FS.Create(name, category)
}

// recordingLog is the learner's raftlog, recording each write in the
// trace and failing one Append on demand.
type recordingLog struct {
	*raftlog.Log
	env      *learnerEnv
	failNext bool
}

func (l *recordingLog) Append(entries []*raftpb.Entry, hs *raftpb.HardState) error {
	if l.failNext {
		l.failNext = false
		l.env.record("L: append FAILED (fsync error): nothing written")
		return errors.New("injected fsync failure")
	}
	if err := l.Log.Append(entries, hs); err != nil {
		return err
	}
	if len(entries) > 0 {
		l.env.record("L: append entries %s, then sync; commit %d", describeEntries(entries), hs.GetCommit())
	} else {
		l.env.record("L: append HardState term %d commit %d, then sync", hs.GetTerm(), hs.GetCommit())
	}
	return nil
}

func (l *recordingLog) ApplySnapshot(meta *raftpb.SnapshotMetadata) error {
	l.env.record("L: restart the log after snapshot %d/%d", meta.GetTerm(), meta.GetIndex())
	return l.Log.ApplySnapshot(meta)
}

func (l *recordingLog) Compact(index uint64, cs *raftpb.ConfState) error {
	l.env.record("L: truncate the log up to %d", index)
	return l.Log.Compact(index, cs)
}

type recordingSender struct{ env *learnerEnv }

func (s recordingSender) Send(msgs []*raftpb.Message) {
	for _, m := range msgs {
		s.env.record("L: send %s", raft.DescribeMessage(m, quoteData))
	}
	s.env.sent = append(s.env.sent, msgs...)
}

// recordingPeers records the learner's changes to its transport's peers.
type recordingPeers struct{ env *learnerEnv }

func (p recordingPeers) AddPeer(id uint64, urls []string) {
	p.env.record("L: transport: add peer %d %v", id, urls)
}

func (p recordingPeers) UpdatePeer(id uint64, urls []string) {
	p.env.record("L: transport: update peer %d %v", id, urls)
}

func (p recordingPeers) RemovePeer(id uint64) { p.env.record("L: transport: remove peer %d", id) }

func newLearnerEnv(t *testing.T) *learnerEnv {
	env := &learnerEnv{t: t, fs: &recordFailFS{FS: vfs.NewMem()}, storage: raft.NewMemoryStorage(),
		rec: &ClusterRecord{ClusterID: 0xc1, MemberID: 2, Peers: map[uint64][]string{1: {"http://leader"}}, Voters: []uint64{1}}}
	rn, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: env.storage,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, Logger: raftDiscard{}})
	if err != nil {
		t.Fatal(err)
	}
	env.leader = rn
	// A cluster of one that adds the learner: the learner's log starts at
	// index 1, as a logger's does in a strata cluster whose leader has
	// truncated nothing.
	if err := rn.Bootstrap([]raft.Peer{{ID: 1}}); err != nil {
		t.Fatal(err)
	}
	env.leaderReady()
	if err := rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	env.leaderReady()
	cc := &raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode.Enum(), NodeId: proto.Uint64(2)}
	if err := rn.ProposeConfChange(cc); err != nil {
		t.Fatal(err)
	}
	env.leaderReady()
	env.trace, env.toL = nil, nil
	env.openLearner()
	return env
}

func (env *learnerEnv) openLearner() {
	t := env.t
	if err := env.fs.MkdirAll("/c", 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := raftlog.Open(raftlog.Options{FS: env.fs, Dirs: []string{"/c/log"}})
	if err != nil {
		t.Fatal(err)
	}
	env.log = &recordingLog{Log: l, env: env}
	rec := env.rec
	if onDisk, err := readRecord(env.fs, "/c"); err == nil {
		rec = onDisk // a restart reads what the learner recorded
	}
	gaps, err := readGaps(env.fs, "/c")
	if err == nil {
		gaps, err = reconcileGaps(env.fs, "/c", env.log, gaps, env.truncatedTo, time.Unix(0, 0))
	}
	if err != nil {
		t.Fatal(err)
	}
	env.ln, err = newLearner(learnerConfig{Record: rec, Dir: "/c", Attributes: env.attrs, FS: env.fs, Log: env.log, Gaps: gaps,
		Inbox: NewInbox(), Sender: recordingSender{env}, Peers: recordingPeers{env}, TickInterval: time.Millisecond,
		Now: func() time.Time { return time.Unix(0, 0) }})
	if err != nil {
		t.Fatal(err)
	}
}

func (env *learnerEnv) close() { _ = env.log.Close() }

func (env *learnerEnv) record(format string, args ...any) {
	env.trace = append(env.trace, fmt.Sprintf(format, args...))
}

func (env *learnerEnv) flush() string {
	out := strings.Join(env.trace, "\n")
	env.trace = nil
	if out == "" {
		return "ok"
	}
	return out
}

// leaderReady handles every Ready of the leader; it reports whether there
// was one.
func (env *learnerEnv) leaderReady() bool {
	did := false
	for env.leader.HasReady() {
		did = true
		rd := env.leader.Ready()
		if !raft.IsEmptyHardState(rd.HardState) {
			if err := env.storage.SetHardState(rd.HardState); err != nil {
				env.t.Fatal(err)
			}
		}
		if err := env.storage.Append(rd.Entries); err != nil {
			env.t.Fatal(err)
		}
		for _, m := range rd.Messages {
			if m.GetTo() == 2 {
				env.record("1: send %s", raft.DescribeMessage(m, quoteData))
				env.toL = append(env.toL, m)
			}
		}
		for _, e := range rd.CommittedEntries {
			if e.GetType() == raftpb.EntryConfChange {
				var cc raftpb.ConfChange
				if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
					env.t.Fatal(err)
				}
				env.leaderCS = *env.leader.ApplyConfChange(&cc)
			}
		}
		env.leader.Advance(rd)
	}
	return did
}

func (env *learnerEnv) deliver() bool {
	msgs := env.toL
	env.toL = nil
	for _, m := range msgs {
		env.ln.step(m)
	}
	return len(msgs) > 0
}

func (env *learnerEnv) respond() bool {
	msgs := env.sent
	env.sent = nil
	for _, m := range msgs {
		_ = env.leader.Step(m)
	}
	return len(msgs) > 0
}

func (env *learnerEnv) learnerReady() (bool, error) {
	if !env.ln.rn.HasReady() {
		return false, nil
	}
	return true, env.ln.handleReady()
}

func (env *learnerEnv) handle(t *testing.T, td *datadriven.TestData) string {
	switch td.Cmd {
	case "propose":
		if err := env.leader.Propose([]byte(td.CmdArgs[0].Key)); err != nil {
			td.Fatalf(t, "propose: %v", err)
		}
	case "leader-ready":
		env.leaderReady()
	case "deliver":
		env.deliver()
	case "respond":
		env.respond()
	case "learner-ready":
		if _, err := env.learnerReady(); err != nil {
			env.record("L: Ready failed: %v", err)
		}
	case "stabilize":
		for i := 0; i < 100; i++ {
			a := env.leaderReady()
			b := env.deliver()
			c, err := env.learnerReady()
			if err != nil {
				env.record("L: Ready failed: %v", err)
				break
			}
			d := env.respond()
			if !a && !b && !c && !d {
				break
			}
		}
	case "tick-leader":
		env.leader.Tick()
		env.leaderReady()
	case "tick-learner":
		n, err := strconv.Atoi(td.CmdArgs[0].Key)
		if err != nil {
			td.Fatalf(t, "ticks: %v", err)
		}
		for range n {
			if err := env.ln.tick(); err != nil {
				env.record("L: tick: %v", err)
			}
			for env.ln.rn.HasReady() {
				if err := env.ln.handleReady(); err != nil {
					env.record("L: handle Ready: %v", err)
					break
				}
			}
		}
	case "vote-request":
		for _, typ := range []raftpb.MessageType{raftpb.MsgPreVote, raftpb.MsgVote, raftpb.MsgTimeoutNow} {
			env.ln.step(&raftpb.Message{Type: typ.Enum(), From: proto.Uint64(3), To: proto.Uint64(2),
				Term: proto.Uint64(99), LogTerm: proto.Uint64(99), Index: proto.Uint64(1000)})
		}
		for env.ln.rn.HasReady() {
			if err := env.ln.handleReady(); err != nil {
				env.record("L: handle Ready: %v", err)
				break
			}
		}
	case "add-member", "add-learner", "remove-member":
		id, err := strconv.ParseUint(td.CmdArgs[0].Key, 10, 64)
		if err != nil {
			td.Fatalf(t, "member id: %v", err)
		}
		typ := map[string]raftpb.ConfChangeType{"add-member": raftpb.ConfChangeAddNode,
			"add-learner": raftpb.ConfChangeAddLearnerNode, "remove-member": raftpb.ConfChangeRemoveNode}[td.Cmd]
		cc := &raftpb.ConfChange{Type: typ.Enum(), NodeId: proto.Uint64(id)}
		if len(td.CmdArgs) > 1 {
			raw, err := proto.Marshal(&pb.Member{ID: id, PeerURLs: []string{td.CmdArgs[1].Key}})
			if err != nil {
				td.Fatalf(t, "member: %v", err)
			}
			cc.Context = raw
		}
		if err := env.leader.ProposeConfChange(cc); err != nil {
			td.Fatalf(t, "propose conf change: %v", err)
		}
	case "truncate":
		idx, err := strconv.ParseUint(td.CmdArgs[0].Key, 10, 64)
		if err != nil {
			td.Fatalf(t, "index: %v", err)
		}
		env.truncatedTo = max(env.truncatedTo, idx)
		env.ln.requestTrim(idx)
		if err := env.ln.trim(); err != nil {
			env.record("L: truncate failed: %v", err)
		}
	case "fail-append":
		env.log.failNext = true
	case "fail-record":
		env.fs.failNext.Store(true)
	case "compact-leader":
		idx, err := strconv.ParseUint(td.CmdArgs[0].Key, 10, 64)
		if err != nil {
			td.Fatalf(t, "index: %v", err)
		}
		cs := proto.CloneOf(&env.leaderCS)
		if _, err := env.storage.CreateSnapshot(idx, cs, nil); err != nil {
			td.Fatalf(t, "snapshot: %v", err)
		}
		if err := env.storage.Compact(idx); err != nil {
			td.Fatalf(t, "compact: %v", err)
		}
		env.record("1: log compacted up to %d", idx)
	case "restart":
		// Whatever was not synced is lost with the process; the leader's
		// messages in flight to it are lost too.
		if err := env.log.Close(); err != nil {
			td.Fatalf(t, "close: %v", err)
		}
		env.toL, env.sent = nil, nil
		env.openLearner()
		env.ln.requestTrim(env.truncatedTo)
		env.leader.ReportUnreachable(2)
		env.record("L: restarted")
	case "publish":
		env.attrs = &Attributes{Name: td.CmdArgs[0].Key, ClientURLs: []string{td.CmdArgs[1].Key}}
		env.ln.cfg.Attributes = env.attrs
		env.ln.published = env.attrs.equal(env.ln.publishedAttrs)
		env.ln.lastPublish = time.Time{} // the retry interval has passed
		env.ln.maybePublish()
		if env.ln.published {
			env.record("L: attributes already published: nothing proposed")
		}
	case "status":
		first, _ := env.log.FirstIndex()
		last, _ := env.log.LastIndex()
		env.record("L: holds [%d, %d], commit %d", first, last, env.ln.commit.Load())
		for _, g := range env.ln.gaps() {
			env.record("L: gap: %s", g)
		}
		env.record("L: voters %v", env.ln.voters())
		if rec, err := readRecord(env.fs, "/c"); err == nil {
			env.record("L: cluster.json: peers %v voters %v", rec.Peers, rec.Voters)
			if len(rec.Removed) > 0 {
				env.record("L: cluster.json: removed %v", rec.Removed)
			}
			if rec.Published != nil {
				env.record("L: cluster.json: published %+v", *rec.Published)
			}
		}
		if gaps, _ := readGaps(env.fs, "/c"); len(gaps) > 0 {
			env.record("L: gaps.json holds %d gap(s)", len(gaps))
		}
	default:
		td.Fatalf(t, "unknown command %q", td.Cmd)
	}
	return env.flush()
}

func describeEntries(entries []*raftpb.Entry) string {
	var parts []string
	for _, e := range entries {
		parts = append(parts, raft.DescribeEntry(e, quoteData))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// quoteData shows an entry's data: an attributes request as such, anything
// else quoted.
func quoteData(b []byte) string {
	var req pb.InternalRaftRequest
	if err := proto.Unmarshal(b, &req); err == nil && req.ClusterMemberAttrSet != nil {
		a := req.ClusterMemberAttrSet
		return fmt.Sprintf("attrs(member %d: %q %v)", a.Member_ID, a.MemberAttributes.GetName(), a.MemberAttributes.GetClientUrls())
	}
	return strconv.Quote(string(b))
}

// raftDiscard is a raft.Logger that logs nothing.
type raftDiscard struct{}

func (raftDiscard) Debug(...interface{})            {}
func (raftDiscard) Debugf(string, ...interface{})   {}
func (raftDiscard) Error(...interface{})            {}
func (raftDiscard) Errorf(string, ...interface{})   {}
func (raftDiscard) Info(...interface{})             {}
func (raftDiscard) Infof(string, ...interface{})    {}
func (raftDiscard) Warning(...interface{})          {}
func (raftDiscard) Warningf(string, ...interface{}) {}
func (raftDiscard) Fatal(v ...interface{})          { panic(fmt.Sprint(v...)) }
func (raftDiscard) Fatalf(f string, v ...interface{}) {
	panic(fmt.Sprintf(f, v...))
}
func (raftDiscard) Panic(v ...interface{})            { panic(fmt.Sprint(v...)) }
func (raftDiscard) Panicf(f string, v ...interface{}) { panic(fmt.Sprintf(f, v...)) }
