package member

// Incremental snapshots (docs/log-compaction.md, "Incremental snapshots"):
// when raft sends a member a snapshot and the leader's compacted batch
// files cover the member's gap, the leader streams those files and the
// entries after them instead of its whole engine, if that is smaller. The
// member checks it can reach the snapshot from its own state, stages the
// decoded stream, and installs it through the applier (InstallCatchUp);
// otherwise it refuses, the transfer fails, and the leader sends a full
// snapshot to that member next time.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/raftlog"
	"github.com/strata-kv/strata/snapshot"
	"github.com/strata-kv/strata/transport"
)

// maxIncrementalBytes bounds an incremental snapshot stream: the member
// decodes it into memory and installs it in one engine batch. Above it
// the leader sends a full snapshot, whose install streams into a table.
const maxIncrementalBytes = 64 << 20

// statusTimeout bounds the wait for raft's progress of the member.
const statusTimeout = 2 * time.Second

// batchSpan is what the choice needs to know of one compacted batch file.
type batchSpan struct {
	first, last, lastTerm uint64
	size                  int64
}

// incrementalPlan is what an incremental snapshot sends.
type incrementalPlan struct {
	base, baseTerm uint64
	// send are the indexes, in the spans given to planIncremental, of the
	// batches to send (those ending above base).
	send []int
	// end is the index the member ends at; the entries (logSnap, end]
	// follow the batches when end > logSnap.
	end uint64
}

// planIncremental decides whether an incremental snapshot can take a
// member from its match index to the snapshot at snapIndex, and what it
// holds (docs/log-compaction.md, leader steps 1-3). spans are the leader's
// compacted batch files ending at or above min(match, snapIndex), oldest
// first; logSnap and logSnapTerm are the log's snapshot point and its
// term. A non-empty reason says why not.
func planIncremental(match, snapIndex, logSnap, logSnapTerm uint64, spans []batchSpan) (incrementalPlan, string) {
	var p incrementalPlan
	if match == 0 {
		return p, "the member's match index is unknown"
	}
	for i := 1; i < len(spans); i++ {
		if spans[i].first != spans[i-1].last+1 {
			return p, fmt.Sprintf("compacted batches %d..%d and %d..%d are not consecutive",
				spans[i-1].first, spans[i-1].last, spans[i].first, spans[i].last)
		}
	}
	if n := len(spans); n > 0 && spans[n-1].last != logSnap {
		return p, fmt.Sprintf("the newest compacted batch ends at %d, not at the log's snapshot point %d", spans[n-1].last, logSnap)
	}
	p.base = min(match, snapIndex, logSnap)
	p.end = max(logSnap, snapIndex)
	if p.base >= p.end {
		return p, fmt.Sprintf("the member's log reaches %d, the snapshot's end %d", match, p.end)
	}
	if p.base == logSnap {
		p.baseTerm = logSnapTerm
	}
	for i, s := range spans {
		switch {
		case s.last < p.base:
			// Below the base: not needed (not listed by the caller).
		case s.last == p.base:
			p.baseTerm = s.lastTerm
		default:
			if len(p.send) == 0 && s.first > p.base+1 {
				return p, fmt.Sprintf("the member's log reaches %d, below the oldest compacted batch %d..%d", match, s.first, s.last)
			}
			p.send = append(p.send, i)
		}
	}
	if len(p.send) == 0 && p.base < logSnap {
		return p, fmt.Sprintf("no compacted batch covers %d..%d (the member's log reaches %d)", p.base+1, logSnap, match)
	}
	return p, ""
}

// incrementalBytes is the length of the incremental stream for batches of
// batchBytes in n files and entries.
func incrementalBytes(n int, batchBytes int64, entries []*raftpb.Entry) int64 {
	size := int64(64+4+16) + int64(n)*8 + batchBytes
	for _, e := range entries {
		size += 24 + int64(len(e.GetData()))
	}
	return size
}

// snapshotMetrics count the snapshots this member sends and receives, by
// kind (snapshot.KindFull, snapshot.KindIncremental).
type snapshotMetrics struct {
	sent, sentBytes, sendFailures *prometheus.CounterVec
	received, receivedBytes       *prometheus.CounterVec
	refused                       prometheus.Counter
}

func newSnapshotMetrics(reg *prometheus.Registry, logger *zap.Logger) *snapshotMetrics {
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"kind"})
	}
	sm := &snapshotMetrics{
		sent:          vec("strata_snapshot_sent_total", "Raft snapshots whose transfer to a member completed, by kind (full: the whole engine; incremental: compacted log batches)."),
		sentBytes:     vec("strata_snapshot_sent_bytes_total", "Bytes of the raft snapshots counted by strata_snapshot_sent_total."),
		sendFailures:  vec("strata_snapshot_send_failures_total", "Raft snapshot transfers to a member that failed, by kind."),
		received:      vec("strata_snapshot_received_total", "Raft snapshots received and staged for install, by kind."),
		receivedBytes: vec("strata_snapshot_received_bytes_total", "Bytes of the raft snapshots counted by strata_snapshot_received_total."),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_snapshot_incremental_refused_total",
			Help: "Incremental raft snapshots this member refused (it could not reach the snapshot from its own state); the leader then sends a full one."}),
	}
	for _, kind := range []string{snapshot.KindFull, snapshot.KindIncremental} {
		for _, v := range []*prometheus.CounterVec{sm.sent, sm.sentBytes, sm.sendFailures, sm.received, sm.receivedBytes} {
			v.WithLabelValues(kind) // export zeros
		}
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{sm.sent, sm.sentBytes, sm.sendFailures, sm.received, sm.receivedBytes, sm.refused} {
			if err := reg.Register(c); err != nil {
				logger.Warn("snapshot metric not registered", zap.Error(err))
			}
		}
	}
	return sm
}

// outgoing is a snapshot transfer to one member, from Open to raft's
// report of its outcome.
type outgoing struct {
	kind   string
	index  uint64
	bytes  atomic.Int64
	closed atomic.Bool // the transport has finished with the data
}

// countingReader counts what the transport reads of a snapshot's data.
type countingReader struct {
	io.ReadCloser
	out *outgoing
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.out.bytes.Add(int64(n))
	return n, err
}

func (c *countingReader) Close() error {
	err := c.ReadCloser.Close()
	c.out.closed.Store(true)
	return err
}

// snapshotReports passes the transport's reports on to the node, telling
// the snapshotter how each transfer ended first.
type snapshotReports struct {
	transport.Handler
	s *snapshotter
}

// ReportSnapshot implements transport.Handler.
func (h snapshotReports) ReportSnapshot(id uint64, status raft.SnapshotStatus) {
	h.s.reported(id, status)
	h.Handler.ReportSnapshot(id, status)
}

// sendState is the snapshotter's memory of transfers to each member.
type sendState struct {
	mu sync.Mutex
	// pending is the transfer in flight to each member.
	pending map[uint64]*outgoing // guarded by mu
	// forceFull names the members whose last incremental transfer
	// failed: they get a full snapshot next.
	forceFull map[uint64]bool // guarded by mu
}

// reported records how the transfer to member id ended. A failure report
// for a transfer still in flight is the transport refusing a second one
// meanwhile, and says nothing about the first.
func (s *snapshotter) reported(id uint64, status raft.SnapshotStatus) {
	s.send.mu.Lock()
	out := s.send.pending[id]
	if out == nil || !out.closed.Load() {
		s.send.mu.Unlock()
		return
	}
	delete(s.send.pending, id)
	ok := status == raft.SnapshotFinish
	switch {
	case ok && out.kind == snapshot.KindFull:
		delete(s.send.forceFull, id)
	case !ok && out.kind == snapshot.KindIncremental:
		s.send.forceFull[id] = true
	}
	s.send.mu.Unlock()
	lg := s.m.logger.With(zap.String("to", fmt.Sprintf("%x", id)), zap.Uint64("index", out.index),
		zap.String("kind", out.kind), zap.Int64("bytes", out.bytes.Load()))
	if !ok {
		s.metrics.sendFailures.WithLabelValues(out.kind).Inc()
		lg.Warn("snapshot transfer failed")
		return
	}
	s.metrics.sent.WithLabelValues(out.kind).Inc()
	s.metrics.sentBytes.WithLabelValues(out.kind).Add(float64(out.bytes.Load()))
	lg.Info("sent " + out.kind + " snapshot")
}

// openIncremental returns the incremental stream for msg, or why it sends
// a full snapshot instead; view, when not nil, is the engine view opened
// to weigh the two, for the full snapshot to use.
func (s *snapshotter) openIncremental(msg *raftpb.Message) (rc io.ReadCloser, view fullView, reason string) {
	m := s.m
	to := msg.GetTo()
	meta := msg.GetSnapshot().GetMetadata()
	snapIndex := meta.GetIndex()
	s.send.mu.Lock()
	force := s.send.forceFull[to]
	s.send.mu.Unlock()
	if force {
		return nil, nil, "the last incremental snapshot to this member failed"
	}
	if m.log.Stats().BatchFiles == 0 {
		return nil, nil, "no compacted batch files"
	}
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	st, err := m.node.Status(ctx)
	cancel()
	if err != nil {
		return nil, nil, fmt.Sprintf("raft status: %v", err)
	}
	pr, ok := st.Progress[to]
	if !ok {
		return nil, nil, "no raft progress for the member"
	}
	match := pr.Match
	after := min(match, snapIndex)
	if after > 0 {
		after-- // the batch ending at the base gives its term
	}
	logSnap, files, err := m.log.OpenCompactedBatches(after)
	if err != nil {
		return nil, nil, fmt.Sprintf("open compacted batches: %v", err)
	}
	keep := false
	defer func() {
		if !keep {
			raftlog.CloseBatchFiles(files)
		}
	}()
	logSnapTerm, err := m.log.Term(logSnap)
	if err != nil {
		return nil, nil, fmt.Sprintf("term of the log's snapshot point %d: %v", logSnap, err)
	}
	spans := make([]batchSpan, len(files))
	for i, f := range files {
		spans[i] = batchSpan{first: f.First, last: f.Last, lastTerm: f.LastTerm, size: f.Size}
	}
	plan, reason := planIncremental(match, snapIndex, logSnap, logSnapTerm, spans)
	if reason != "" {
		return nil, nil, reason
	}
	var entries []*raftpb.Entry
	if plan.end > logSnap {
		entries, err = m.log.Entries(logSnap+1, plan.end+1, maxIncrementalBytes)
		if err != nil {
			return nil, nil, fmt.Sprintf("entries %d..%d: %v", logSnap+1, plan.end, err)
		}
		if n := len(entries); n == 0 || entries[n-1].GetIndex() != plan.end {
			return nil, nil, fmt.Sprintf("entries %d..%d exceed %d bytes", logSnap+1, plan.end, maxIncrementalBytes)
		}
	}
	var sources []snapshot.BatchSource
	var batchBytes int64
	for _, i := range plan.send {
		sources = append(sources, snapshot.BatchSource{Size: files[i].Size, R: files[i].Reader()})
		batchBytes += files[i].Size
	}
	size := incrementalBytes(len(sources), batchBytes, entries)
	if size > maxIncrementalBytes {
		return nil, nil, fmt.Sprintf("the incremental snapshot would be %d bytes, above %d", size, maxIncrementalBytes)
	}
	v, err := m.engine.NewExportView()
	if err != nil {
		return nil, nil, fmt.Sprintf("engine view: %v", err)
	}
	full, err := snapshot.Size(v.ForEach, size)
	if err != nil {
		return nil, v, fmt.Sprintf("size of a full snapshot: %v", err)
	}
	if full <= size {
		return nil, v, fmt.Sprintf("a full snapshot (%d bytes) is no larger than the incremental one (%d bytes)", full, size)
	}
	_ = v.Close()
	h := snapshot.IncrementalHeader{Index: snapIndex, Term: meta.GetTerm(), Base: plan.base, BaseTerm: plan.baseTerm, End: plan.end}
	m.logger.Info("sending incremental snapshot", zap.String("to", fmt.Sprintf("%x", to)), zap.Uint64("index", snapIndex),
		zap.Uint64("match", match), zap.Uint64("base", plan.base), zap.Uint64("end", plan.end),
		zap.Int("batches", len(sources)), zap.Int("entries", len(entries)), zap.Int64("bytes", size),
		zap.String("full-snapshot-bytes", fmt.Sprintf("> %d", size)))
	keep = true
	pr2, pw := io.Pipe()
	go func() {
		_, err := snapshot.WriteIncremental(pw, h, sources, entries)
		raftlog.CloseBatchFiles(files)
		pw.CloseWithError(err)
	}()
	return pr2, nil, ""
}

// fullView is the engine view a full snapshot streams.
type fullView interface {
	AppliedIndex() uint64
	ForEach(fn func(key, value []byte) error) error
	Close() error
}

// checkCatchUp says why a member at applied index applied, whose log holds
// [first, last] (term gives the term of an entry in it), cannot reach an
// incremental snapshot's state from base (member step 2), or nil if it can.
func checkCatchUp(applied, first, last uint64, term func(uint64) (uint64, error), base, baseTerm uint64) error {
	if applied >= base {
		return nil
	}
	if first > applied+1 {
		return fmt.Errorf("applied index %d is below the base %d and the log starts at %d", applied, base, first)
	}
	if last < base {
		return fmt.Errorf("applied index %d is below the base %d and the log ends at %d", applied, base, last)
	}
	if baseTerm == 0 {
		return nil
	}
	t, err := term(base)
	if err != nil {
		return fmt.Errorf("term of the base %d: %w", base, err)
	}
	if t != baseTerm {
		return fmt.Errorf("the log's entry at the base %d has term %d, the leader's %d", base, t, baseTerm)
	}
	return nil
}

// errRefused marks an incremental snapshot this member cannot install.
var errRefused = errors.New("incremental snapshot refused")

// receiveIncremental decodes an incremental stream, checks this member
// can reach its state, and stages it for install.
func (s *snapshotter) receiveIncremental(msg *raftpb.Message, r io.Reader) error {
	m := s.m
	meta := msg.GetSnapshot().GetMetadata()
	inc, err := snapshot.ReadIncremental(r, maxIncrementalBytes)
	if err != nil {
		return err
	}
	if inc.Index != meta.GetIndex() || inc.Term != meta.GetTerm() {
		return fmt.Errorf("incremental snapshot stream for index %d term %d, the message's is %d term %d",
			inc.Index, inc.Term, meta.GetIndex(), meta.GetTerm())
	}
	applied := m.applier.AppliedIndex()
	first, err := m.log.FirstIndex()
	if err != nil {
		return err
	}
	last, err := m.log.LastIndex()
	if err != nil {
		return err
	}
	if err := checkCatchUp(applied, first, last, m.log.Term, inc.Base, inc.BaseTerm); err != nil {
		s.metrics.refused.Inc()
		m.logger.Warn("refused incremental snapshot", zap.Uint64("index", inc.Index), zap.Uint64("base", inc.Base), zap.Error(err))
		return fmt.Errorf("%w: %w", errRefused, err)
	}
	s.stage(inc.Index, stagedSnapshot{inc: inc})
	s.metrics.received.WithLabelValues(snapshot.KindIncremental).Inc()
	s.metrics.receivedBytes.WithLabelValues(snapshot.KindIncremental).Add(float64(inc.Bytes))
	m.logger.Info("received incremental snapshot", zap.Uint64("index", inc.Index), zap.Uint64("applied", applied),
		zap.Uint64("base", inc.Base), zap.Uint64("end", inc.End), zap.Int("batches", len(inc.Batches)),
		zap.Int64("batch-bytes", inc.BatchBytes), zap.Int("entries", len(inc.Entries)), zap.Int64("bytes", inc.Bytes))
	return nil
}

// installIncremental installs a staged incremental snapshot (on the
// applier goroutine).
func (s *snapshotter) installIncremental(snap *raftpb.Snapshot, inc *snapshot.Incremental) error {
	m := s.m
	from := m.applier.AppliedIndex()
	start := time.Now()
	st, err := m.applier.InstallCatchUp(apply.CatchUp{
		Base: inc.Base, OwnEntries: m.log.Entries, Batches: inc.Batches, Entries: inc.Entries, End: inc.End,
		ConfState: snap.GetMetadata().GetConfState(), MinTTL: m.leaseMinTTL(),
	})
	if err != nil {
		return err
	}
	// The node restarts the log after the snapshot once this returns: the
	// engine, whose commits are not synced (its WAL is off), must hold the
	// new state durably first (DESIGN.md rule 4), as an ingested full
	// snapshot does. Without this flush a crash lost the install while
	// the log had forgotten the entries before it.
	if err := m.engine.Flush(); err != nil {
		return fmt.Errorf("flush the engine after an incremental snapshot to %d: %w", inc.End, err)
	}
	if d := m.engine.DurableIndex(); d < inc.End {
		return fmt.Errorf("engine durable at %d after flushing an incremental snapshot to %d", d, inc.End)
	}
	m.logger.Info("installed incremental snapshot", zap.Uint64("index", inc.Index), zap.Uint64("from", from),
		zap.Uint64("to", inc.End), zap.Int("own-entries", st.OwnEntries), zap.Int("records", st.Records),
		zap.Int("entries", st.Entries), zap.Duration("took", time.Since(start)))
	return nil
}
