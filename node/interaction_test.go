package node

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/datadriven"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
)

// TestInteraction runs the scripts in testdata/: deterministic interaction
// tests of the Ready contract (the numbered steps in node.go), in the style
// of etcd-io/raft's interaction tests. The script drives every node by
// hand -- ticks, proposals, reads, one Ready at a time, the delivery of
// messages -- on the test's goroutine, with no timer and no Run loop, and
// the output is the trace of the node's I/O in the order it happened: log
// appends and truncations, messages sent, batches handed to the applier,
// read-index answers. Rewrite the expectations with -rewrite, then read
// them: they are the contract.
//
// Commands:
//
//	add-nodes n [snapshot-count=k] [catch-up=c]   a new cluster of n members
//	campaign id                                   id starts an election
//	tick id [n]                                   n ticks of id's clock
//	propose id data                               a proposal at id
//	read-index id                                 a linearizable read at id
//	process-ready id...                           each id handles one Ready
//	deliver-msgs [id...]                          deliver messages to ids (all)
//	drop-msgs id                                  lose the messages id sent
//	isolate id, heal id                           lose every message to or from id, or no more
//	engine-ahead id n                             id's next install ends n entries past the snapshot
//	stabilize                                     Readys and deliveries until quiet
//	status id                                     what id's node publishes
func TestInteraction(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		env := &interaction{t: t, nodes: map[uint64]*scriptedNode{}, isolated: map[uint64]bool{}}
		defer env.close()
		datadriven.RunTest(t, path, env.handle)
	})
}

// interaction is one script's cluster.
type interaction struct {
	t        *testing.T
	nodes    map[uint64]*scriptedNode
	isolated map[uint64]bool
	// trace collects the I/O of the command running, from the test's
	// goroutine and the appliers', in the order it happened.
	mu    sync.Mutex
	trace []string
}

func (env *interaction) record(format string, args ...any) {
	env.mu.Lock()
	defer env.mu.Unlock()
	env.collectLocked()
	env.trace = append(env.trace, fmt.Sprintf(format, args...))
}

func (env *interaction) flush() string {
	env.mu.Lock()
	defer env.mu.Unlock()
	env.collectLocked()
	out := strings.Join(env.trace, "\n")
	env.trace = nil
	if out == "" {
		return "ok"
	}
	return out
}

// scriptedNode is a node with its log, engine, outbox and applier.
type scriptedNode struct {
	id     uint64
	env    *interaction
	n      *Node
	log    *tracedLog
	eng    *fakeEngine
	outbox []*raftpb.Message
	// reads are the read-index requests not answered yet, by the
	// sequence the script gave them.
	reads   map[int]chan readResult
	readSeq int
	// installAhead is how far past a snapshot's index the next install
	// leaves the engine (engine-ahead).
	installAhead uint64
	// The applier goroutine takes the node's handed-off batches; barrier
	// waits until it has taken everything handed off so far.
	applied  chan uint64
	barrierc chan chan struct{}
	stop     chan struct{}
	wg       sync.WaitGroup
}

// tracedLog is memLog recording the node's writes into the trace.
type tracedLog struct {
	*memLog
	id  uint64
	env *interaction
}

func (l *tracedLog) Append(entries []*raftpb.Entry, hs *raftpb.HardState) error {
	var parts []string
	if len(entries) > 0 {
		parts = append(parts, "entries "+describeEntries(entries))
	}
	if hs != nil {
		parts = append(parts, raft.DescribeHardState(hs))
	}
	l.env.record("%d: append %s", l.id, strings.Join(parts, " "))
	return l.memLog.Append(entries, hs)
}

func (l *tracedLog) Compact(index uint64, cs *raftpb.ConfState) error {
	l.env.record("%d: truncate log to %d (%s)", l.id, index, raft.DescribeConfState(cs))
	return l.memLog.Compact(index, cs)
}

func (l *tracedLog) BeginSnapshot(meta *raftpb.SnapshotMetadata) error {
	l.env.record("%d: record pending snapshot %d/%d", l.id, meta.GetIndex(), meta.GetTerm())
	return l.memLog.BeginSnapshot(meta)
}

func (l *tracedLog) ApplySnapshot(meta *raftpb.SnapshotMetadata) error {
	l.env.record("%d: restart log after snapshot %d/%d", l.id, meta.GetIndex(), meta.GetTerm())
	return l.memLog.ApplySnapshot(meta)
}

func (l *tracedLog) ForgetPendingSnapshot() error {
	if l.PendingSnapshot() != nil {
		l.env.record("%d: forget pending snapshot", l.id)
	}
	return l.memLog.ForgetPendingSnapshot()
}

func describeEntries(entries []*raftpb.Entry) string {
	var parts []string
	for _, e := range entries {
		parts = append(parts, raft.DescribeEntry(e, quoteData))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// collectLocked moves the messages each node handed to its transport
// (Node.Outgoing) into the node's outbox, recording each send. record and
// flush call it first: a node hands messages over before whatever it does
// next, so the trace shows each send before the events that followed it,
// as the node goroutine performed them.
//
// REQUIRES: env.mu held.
func (env *interaction) collectLocked() {
	for _, id := range env.ids() {
		sn := env.nodes[id]
		for more := true; more; {
			select {
			case msgs := <-sn.n.outgoing:
				for _, m := range msgs {
					env.trace = append(env.trace, fmt.Sprintf("%d: send %s", sn.id, describeMessage(m)))
				}
				sn.outbox = append(sn.outbox, msgs...)
			default:
				more = false
			}
		}
	}
}

func describeMessage(m *raftpb.Message) string {
	line := raft.DescribeMessage(m, quoteData)
	if c := m.GetContext(); len(c) == 8 && (m.GetType() == raftpb.MsgHeartbeat || m.GetType() == raftpb.MsgHeartbeatResp) {
		// raft's read-only confirmation sequence: an acknowledgement
		// confirms every read request issued at or before it.
		line += fmt.Sprintf(" confirms:%d", binary.LittleEndian.Uint64(c))
	}
	return line
}

func quoteData(b []byte) string { return strconv.Quote(string(b)) }

func (env *interaction) close() {
	for _, sn := range env.nodes {
		close(sn.stop)
		close(sn.n.done)
		sn.wg.Wait()
		sn.n.flushes.Wait()
	}
}

func (env *interaction) handle(t *testing.T, td *datadriven.TestData) string {
	ids := func(from int) []uint64 {
		var out []uint64
		for _, a := range td.CmdArgs[from:] {
			if a.Vals != nil {
				continue
			}
			id, err := strconv.ParseUint(a.Key, 10, 64)
			if err != nil {
				td.Fatalf(t, "bad node id %q", a.Key)
			}
			if env.nodes[id] == nil {
				td.Fatalf(t, "no node %d", id)
			}
			out = append(out, id)
		}
		return out
	}
	node := func() *scriptedNode {
		if len(td.CmdArgs) == 0 {
			td.Fatalf(t, "%s needs a node id", td.Cmd)
		}
		id, err := strconv.ParseUint(td.CmdArgs[0].Key, 10, 64)
		if err != nil || env.nodes[id] == nil {
			td.Fatalf(t, "no node %q", td.CmdArgs[0].Key)
		}
		return env.nodes[id]
	}
	switch td.Cmd {
	case "add-nodes":
		count, _ := strconv.Atoi(td.CmdArgs[0].Key)
		snapshotCount, catchUp := uint64(1000), uint64(0)
		if td.HasArg("snapshot-count") {
			td.ScanArgs(t, "snapshot-count", &snapshotCount)
		}
		if td.HasArg("catch-up") {
			td.ScanArgs(t, "catch-up", &catchUp)
		}
		env.addNodes(t, count, snapshotCount, catchUp)
	case "campaign":
		if err := node().n.rn.Campaign(); err != nil {
			env.record("campaign: %v", err)
		}
	case "tick":
		sn, count := node(), 1
		if len(td.CmdArgs) > 1 {
			count, _ = strconv.Atoi(td.CmdArgs[1].Key)
		}
		for range count {
			// The Run loop's tick, but for the single-member campaign.
			sn.n.rn.Tick()
			sn.n.ticks++
			if err := sn.n.persistCommit(); err != nil {
				t.Fatal(err)
			}
			sn.n.retryStaleReads()
		}
	case "propose":
		sn := node()
		p := proposal{data: []byte(td.CmdArgs[1].Key), errc: make(chan error, 1)}
		sn.n.handleProposal(p)
		if err := <-p.errc; err != nil {
			env.record("%d: proposal refused: %v", sn.id, err)
		}
	case "read-index":
		sn := node()
		sn.readSeq++
		c := make(chan readResult, 1)
		sn.reads[sn.readSeq] = c
		sn.n.readPending = append(sn.n.readPending, readWaiter{ctx: context.Background(), c: c})
		sn.n.issueReadIndex()
		env.record("%d: read %d waits", sn.id, sn.readSeq)
	case "process-ready":
		for _, id := range ids(0) {
			env.processReady(t, env.nodes[id])
		}
	case "deliver-msgs":
		to := ids(0)
		if len(to) == 0 {
			to = env.ids()
		}
		env.deliver(to)
	case "isolate":
		env.isolated[node().id] = true
	case "heal":
		delete(env.isolated, node().id)
	case "engine-ahead":
		// The next snapshot install leaves the engine durable this many
		// entries past the snapshot's index, as a full install does when
		// the leader's engine view was ahead of the snapshot it sent.
		sn := node()
		sn.installAhead, _ = strconv.ParseUint(td.CmdArgs[1].Key, 10, 64)
	case "drop-msgs":
		sn := node()
		env.mu.Lock()
		env.collectLocked()
		lost := len(sn.outbox)
		sn.outbox = nil
		env.mu.Unlock()
		env.record("%d: %d messages lost", sn.id, lost)
	case "stabilize":
		for {
			busy := false
			for _, id := range env.ids() {
				if env.nodes[id].n.rn.HasReady() {
					env.processReady(t, env.nodes[id])
					busy = true
				}
			}
			if env.deliver(env.ids()) > 0 {
				busy = true
			}
			if !busy {
				break
			}
		}
	case "status":
		sn := node()
		first, _ := sn.log.FirstIndex()
		last, _ := sn.log.LastIndex()
		env.record("%d: term %d leader %d commit %d applied %d log %d..%d durable %d",
			sn.id, sn.n.Term(), sn.n.Leader(), sn.n.CommitIndex(), sn.n.applied, first, last, sn.eng.DurableIndex())
	default:
		td.Fatalf(t, "unknown command %q", td.Cmd)
	}
	return env.flush()
}

func (env *interaction) ids() []uint64 {
	var out []uint64
	for id := range env.nodes {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func (env *interaction) addNodes(t *testing.T, count int, snapshotCount, catchUp uint64) {
	var peers []raft.Peer
	for i := 1; i <= count; i++ {
		peers = append(peers, raft.Peer{ID: uint64(i)})
	}
	for i := 1; i <= count; i++ {
		id := uint64(i)
		sn := &scriptedNode{
			id: id, env: env, eng: &fakeEngine{}, reads: map[int]chan readResult{},
			applied: make(chan uint64, 1024), barrierc: make(chan chan struct{}), stop: make(chan struct{}),
		}
		sn.log = &tracedLog{memLog: &memLog{MemoryStorage: raft.NewMemoryStorage()}, id: id, env: env}
		n, err := New(Config{
			ID: id, Peers: peers, Log: sn.log, Engine: sn.eng,
			ElectionTicks: 3, HeartbeatTicks: 1, SnapshotCount: snapshotCount, CatchUpEntries: catchUp,
			Logger: zap.NewNop(),
		})
		if err != nil {
			t.Fatal(err)
		}
		// Unbuffered: a hand-off completes only when the applier takes it.
		n.committc = make(chan Committed)
		// Rounds numbered from 1, so the script's messages do not change
		// from run to run (a node starts at a random number).
		n.readSeq = 0
		sn.n = n
		env.mu.Lock()
		env.nodes[id] = sn
		env.mu.Unlock()
		sn.wg.Add(1)
		go env.runApplier(sn)
	}
}

// runApplier is the node's applier: it records each batch in the trace,
// makes the engine's applied index follow, answers installs at once, and
// queues the applied index for the script to report (processReady), as
// apply.Applier reports to the node through Applied.
func (env *interaction) runApplier(sn *scriptedNode) {
	defer sn.wg.Done()
	for {
		select {
		case c := <-sn.n.committc:
			if c.Decide != nil {
				env.record("%d: applier decides conf change %d: applies", sn.id, c.Decide.GetIndex())
				c.Decision <- nil
				continue
			}
			var last uint64
			if c.Snapshot != nil {
				last = c.Snapshot.GetMetadata().GetIndex()
				env.record("%d: applier installs snapshot %d/%d (%s)", sn.id, last,
					c.Snapshot.GetMetadata().GetTerm(), raft.DescribeConfState(c.Snapshot.GetMetadata().GetConfState()))
			} else {
				last = c.Entries[len(c.Entries)-1].GetIndex()
				line := fmt.Sprintf("%d: apply %s", sn.id, describeEntries(c.Entries))
				if len(c.ConfStates) > 0 {
					var idx []uint64
					for i := range c.ConfStates {
						idx = append(idx, i)
					}
					sort.Slice(idx, func(a, b int) bool { return idx[a] < idx[b] })
					for _, i := range idx {
						line += fmt.Sprintf(" conf@%d=%s", i, raft.DescribeConfState(c.ConfStates[i]))
					}
				}
				env.record("%s", line)
			}
			sn.eng.mu.Lock()
			sn.eng.applied = max(sn.eng.applied, last)
			if c.Snapshot != nil {
				// An install ends with the engine durable (Installer.Durable).
				sn.eng.applied += sn.installAhead
				sn.eng.durable = sn.eng.applied
				sn.installAhead = 0
			}
			sn.eng.mu.Unlock()
			if c.Installed != nil {
				c.Installed <- nil
			}
			sn.applied <- last
		case done := <-sn.barrierc:
			close(done)
		case <-sn.stop:
			return
		}
	}
}

// processReady has sn handle one Ready, as Run does, then waits for its
// applier, reports what it applied to the node, and, if that started an
// engine flush, has the node truncate the log at the flush's durable index
// (Run's flushc case), so that every effect of the Ready is in the trace.
func (env *interaction) processReady(t *testing.T, sn *scriptedNode) {
	if !sn.n.rn.HasReady() {
		return
	}
	if err := sn.n.handleReady(context.Background()); err != nil {
		t.Fatalf("node %d: handle Ready: %v", sn.id, err)
	}
	done := make(chan struct{})
	sn.barrierc <- done
	<-done
reports:
	for {
		select {
		case idx := <-sn.applied:
			sn.n.handleApplied(idx)
			if sn.n.flushing {
				d := <-sn.n.flushc
				sn.n.flushing = false
				if d.err != nil {
					t.Fatalf("node %d: engine flush: %v", sn.id, d.err)
				}
				env.record("%d: engine flushed, durable %d", sn.id, d.durable)
				if err := sn.n.compactLog(d.durable); err != nil {
					t.Fatalf("node %d: compact log: %v", sn.id, err)
				}
			}
		default:
			break reports
		}
	}
	var seqs []int
	for seq := range sn.reads {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	for _, seq := range seqs {
		select {
		case r := <-sn.reads[seq]:
			env.record("%d: read %d may serve at index %d", sn.id, seq, r.index)
			delete(sn.reads, seq)
		default:
		}
	}
}

// deliver steps every outbox message addressed to one of to into its
// node, in the order sent, and says how many it delivered.
func (env *interaction) deliver(to []uint64) int {
	delivered := 0
	for _, from := range env.ids() {
		sn := env.nodes[from]
		env.mu.Lock()
		env.collectLocked()
		sent := sn.outbox
		sn.outbox = nil
		env.mu.Unlock()
		var keep []*raftpb.Message
		for _, m := range sent {
			dst := env.nodes[m.GetTo()]
			if dst == nil || !slices.Contains(to, m.GetTo()) {
				keep = append(keep, m)
				continue
			}
			delivered++
			if env.isolated[m.GetTo()] || env.isolated[m.GetFrom()] {
				env.record("%d: lost %s from %d", m.GetTo(), m.GetType(), m.GetFrom())
				continue
			}
			env.record("%d: receive %s from %d", m.GetTo(), m.GetType(), m.GetFrom())
			dst.n.step(m)
		}
		env.mu.Lock()
		sn.outbox = append(keep, sn.outbox...)
		env.mu.Unlock()
	}
	return delivered
}
