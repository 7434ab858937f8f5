package snapshot

// The snapshotter moves raft snapshots between members for the transport,
// and stages what it receives for the applier to install. The leader
// streams a consistent export of its engine (a full snapshot), or, when
// its compacted raft log covers the member's gap and that is smaller, the
// compacted batch files and the entries after them (an incremental
// snapshot; docs/log-compaction.md, "Incremental snapshots"). The member
// checks it can reach the snapshot from its own state, stages the decoded
// stream, and hands it to the applier when raft installs the snapshot;
// otherwise it refuses, the transfer fails, and the leader sends a full
// snapshot to that member next time.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/raftlog"
	"github.com/strata-kv/strata/transport"
)

// Raft is what the snapshotter needs of the raft node: the leader's view
// of a member's progress, to plan an incremental
type Raft interface {
	Status(ctx context.Context) (raft.Status, error)
}

// Config is a snapshotter's collaborators.
type Config struct {
	// Dir holds received full snapshots until they are installed.
	Dir    string
	FS     vfs.FS
	Engine engine.Transferable
	Store  *mvcc.Store
	Log    *raftlog.Log
	Raft   Raft
	// LeaseMinTTL is the lessor's minimum TTL, for lease grants an
	// incremental install replays as records.
	LeaseMinTTL int64
	// Registry receives the snapshot metrics; nil registers none.
	Registry *prometheus.Registry
	Logger   *zap.Logger
}

// Snapshotter moves raft snapshots for the transport: the leader streams a
// consistent export of its engine, or the compacted log batches that cover
// the member's gap when that is smaller (incremental.go); the follower
// stages the data (a table, or the decoded batches) that the applier
// installs when raft hands the snapshot over.
//
// Concurrency: Open, Receive and reported run on transport goroutines,
// install on the applier goroutine; the maps are guarded by their mutexes.
type Snapshotter struct {
	cfg     Config
	logger  *zap.Logger
	metrics *snapshotMetrics
	send    sendState

	mu     sync.Mutex
	staged map[uint64]stagedSnapshot // snapshot index -> staged data; guarded by mu
	// received numbers the tables of full snapshots received, so that each
	// has a name of its own: a snapshot sent again at the same index (the
	// first transfer failed after its table was staged) must not write into
	// the table staged, or just ingested, for the first, nor have stage
	// remove it as the one it replaces.
	received atomic.Uint64
}

// stagedSnapshot is a received snapshot waiting for raft: a table to
// ingest (full) or a decoded incremental stream.
type stagedSnapshot struct {
	path string
	inc  *Incremental
}

// NewSnapshotter returns a snapshotter over cfg. It removes the tables a
// previous process left in cfg.Dir: what is staged lives in memory only, so
// no table outlives the process that received it, and each may be as large
// as the whole store (a crash while receiving, after staging, or between
// the ingest and the removal leaves one).
func NewSnapshotter(cfg Config) *Snapshotter {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	s := &Snapshotter{cfg: cfg, logger: cfg.Logger, staged: map[uint64]stagedSnapshot{}}
	s.send.pending = map[uint64]*outgoing{}
	s.send.forceFull = map[uint64]bool{}
	s.metrics = newSnapshotMetrics(cfg.Registry, cfg.Logger)
	s.removeLeftovers()
	return s
}

// removeLeftovers removes every file in the snapshot directory (see
// NewSnapshotter); a failure is logged and the files stay.
func (s *Snapshotter) removeLeftovers() {
	if s.cfg.FS == nil || s.cfg.Dir == "" {
		return
	}
	names, err := s.cfg.FS.List(s.dir())
	if err != nil {
		return // no directory yet: nothing was ever received
	}
	for _, name := range names {
		path := s.cfg.FS.PathJoin(s.dir(), name)
		if err := s.cfg.FS.Remove(path); err != nil {
			s.logger.Warn("remove a snapshot table left by an earlier run", zap.String("path", path), zap.Error(err))
			continue
		}
		s.logger.Info("removed a snapshot table left by an earlier run", zap.String("path", path))
	}
}

func (s *Snapshotter) dir() string { return s.cfg.Dir }

// Open implements transport.Snapshotter: an incremental stream if one can
// and should be sent (incremental.go), else every key of an engine view.
func (s *Snapshotter) Open(msg *raftpb.Message) (io.ReadCloser, error) {
	index := msg.GetSnapshot().GetMetadata().GetIndex()
	kind := KindIncremental
	rc, view, reason := s.openIncremental(msg)
	if rc == nil {
		kind = KindFull
		s.logger.Info("sending full snapshot", zap.String("to", fmt.Sprintf("%x", msg.GetTo())),
			zap.Uint64("index", index), zap.String("reason", reason))
		var err error
		if rc, err = s.openFull(index, view); err != nil {
			return nil, err
		}
	}
	out := &outgoing{kind: kind, index: index}
	s.send.mu.Lock()
	s.send.pending[msg.GetTo()] = out
	s.send.mu.Unlock()
	return &countingReader{ReadCloser: rc, out: out}, nil
}

// openFull streams every key of view (or of a new engine view if nil).
func (s *Snapshotter) openFull(index uint64, view fullView) (io.ReadCloser, error) {
	if view == nil {
		v, err := s.cfg.Engine.NewExportView()
		if err != nil {
			return nil, err
		}
		view = v
	}
	if view.AppliedIndex() < index {
		view.Close()
		return nil, fmt.Errorf("engine at %d is behind snapshot index %d", view.AppliedIndex(), index)
	}
	pr, pw := io.Pipe()
	go func() {
		err := Write(pw, view.AppliedIndex(), view.ForEach)
		view.Close()
		pw.CloseWithError(err)
	}()
	return pr, nil
}

// Receive implements transport.Snapshotter. The first bytes say which
// stream it is.
func (s *Snapshotter) Receive(msg *raftpb.Message, r io.Reader) error {
	br := bufio.NewReaderSize(r, 1<<20)
	if prefix, _ := br.Peek(len(IncrementalMagic)); Kind(prefix) == KindIncremental {
		return s.receiveIncremental(msg, br)
	}
	return s.receiveFull(msg, br)
}

// receiveFull writes a full stream into a table to ingest.
func (s *Snapshotter) receiveFull(msg *raftpb.Message, r io.Reader) error {
	index := msg.GetSnapshot().GetMetadata().GetIndex()
	if err := s.cfg.FS.MkdirAll(s.dir(), 0o700); err != nil {
		return fmt.Errorf("create snapshot dir: %w", err)
	}
	path := filepath.Join(s.dir(), fmt.Sprintf("%016x-%016x-%d.sst",
		msg.GetSnapshot().GetMetadata().GetTerm(), index, s.received.Add(1)))
	w, err := s.cfg.Engine.NewSnapshotWriter(path)
	if err != nil {
		return err
	}
	cr := &byteCounter{r: r}
	applied, records, err := Read(cr, w)
	if err == nil && applied < index {
		err = fmt.Errorf("snapshot stream holds index %d, below the snapshot's %d", applied, index)
	}
	if err != nil {
		w.Abort()
		_ = s.cfg.FS.Remove(path)
		return err
	}
	if err := w.Finish(); err != nil {
		_ = s.cfg.FS.Remove(path)
		return err
	}
	s.stage(index, stagedSnapshot{path: path})
	s.metrics.received.WithLabelValues(KindFull).Inc()
	s.metrics.receivedBytes.WithLabelValues(KindFull).Add(float64(cr.n))
	s.logger.Info("received snapshot", zap.Uint64("index", index), zap.Uint64("engine-index", applied),
		zap.Uint64("records", records), zap.Int64("bytes", cr.n))
	return nil
}

// byteCounter counts the bytes read through it.
type byteCounter struct {
	r io.Reader
	n int64
}

func (c *byteCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// stage keeps st for the snapshot at index, replacing what was staged for
// it, and drops what was staged for snapshots the engine has passed (raft
// ignores a snapshot at or below the commit index, so those are never
// installed).
func (s *Snapshotter) stage(index uint64, st stagedSnapshot) {
	applied := s.cfg.Store.AppliedIndex()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, old := range s.staged {
		if i == index || i <= applied {
			s.discardLocked(i, old)
		}
	}
	s.staged[index] = st
}

// discardLocked forgets a staged snapshot and removes its table.
// REQUIRES: s.mu held.
func (s *Snapshotter) discardLocked(index uint64, st stagedSnapshot) {
	delete(s.staged, index)
	if st.path != "" {
		_ = s.cfg.FS.Remove(st.path)
	}
}

// Install implements apply.Installer: it replaces the store's content with
// the staged full snapshot for snap, or returns the catch-up of a staged
// incremental one for the applier to apply. It runs on the applier
// goroutine.
func (s *Snapshotter) Install(snap *raftpb.Snapshot) (*apply.CatchUp, error) {
	index := snap.GetMetadata().GetIndex()
	s.mu.Lock()
	st, ok := s.staged[index]
	delete(s.staged, index)
	for i, old := range s.staged {
		if i < index {
			s.discardLocked(i, old)
		}
	}
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("no staged data for snapshot at index %d", index)
	}
	if inc := st.inc; inc != nil {
		return &apply.CatchUp{
			Base: inc.Base, OwnEntries: s.cfg.Log.Entries, Batches: inc.Batches, Entries: inc.Entries, End: inc.End,
			ConfState: snap.GetMetadata().GetConfState(), MinTTL: s.cfg.LeaseMinTTL,
		}, nil
	}
	err := s.cfg.Store.Replace(func() error {
		_, err := s.cfg.Engine.InstallSnapshot(st.path)
		return err
	})
	if err != nil {
		return nil, err
	}
	_ = s.cfg.FS.Remove(st.path)
	return nil, nil
}

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
// kind (KindFull, KindIncremental).
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
	for _, kind := range []string{KindFull, KindIncremental} {
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

// Reports returns the handler the transport delivers to: h (the node),
// with each snapshot report told to the snapshotter first, which
// remembers how each transfer ended (a member whose incremental snapshot
// failed gets a full one next).
func (s *Snapshotter) Reports(h transport.Handler) transport.Handler {
	return snapshotReports{Handler: h, s: s}
}

// snapshotReports passes the transport's reports on to the node, telling
// the snapshotter how each transfer ended first.
type snapshotReports struct {
	transport.Handler
	s *Snapshotter
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
func (s *Snapshotter) reported(id uint64, status raft.SnapshotStatus) {
	s.send.mu.Lock()
	out := s.send.pending[id]
	if out == nil || !out.closed.Load() {
		s.send.mu.Unlock()
		return
	}
	delete(s.send.pending, id)
	ok := status == raft.SnapshotFinish
	switch {
	case ok && out.kind == KindFull:
		delete(s.send.forceFull, id)
	case !ok && out.kind == KindIncremental:
		s.send.forceFull[id] = true
	}
	s.send.mu.Unlock()
	lg := s.logger.With(zap.String("to", fmt.Sprintf("%x", id)), zap.Uint64("index", out.index),
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
func (s *Snapshotter) openIncremental(msg *raftpb.Message) (rc io.ReadCloser, view fullView, reason string) {
	to := msg.GetTo()
	meta := msg.GetSnapshot().GetMetadata()
	snapIndex := meta.GetIndex()
	s.send.mu.Lock()
	force := s.send.forceFull[to]
	s.send.mu.Unlock()
	if force {
		return nil, nil, "the last incremental snapshot to this member failed"
	}
	if s.cfg.Log.Stats().BatchFiles == 0 {
		return nil, nil, "no compacted batch files"
	}
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	st, err := s.cfg.Raft.Status(ctx)
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
	logSnap, files, err := s.cfg.Log.OpenCompactedBatches(after)
	if err != nil {
		return nil, nil, fmt.Sprintf("open compacted batches: %v", err)
	}
	keep := false
	defer func() {
		if !keep {
			raftlog.CloseBatchFiles(files)
		}
	}()
	logSnapTerm, err := s.cfg.Log.Term(logSnap)
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
		entries, err = s.cfg.Log.Entries(logSnap+1, plan.end+1, maxIncrementalBytes)
		if err != nil {
			return nil, nil, fmt.Sprintf("entries %d..%d: %v", logSnap+1, plan.end, err)
		}
		if n := len(entries); n == 0 || entries[n-1].GetIndex() != plan.end {
			return nil, nil, fmt.Sprintf("entries %d..%d exceed %d bytes", logSnap+1, plan.end, maxIncrementalBytes)
		}
	}
	var sources []BatchSource
	var batchBytes int64
	for _, i := range plan.send {
		sources = append(sources, BatchSource{Size: files[i].Size, R: files[i].Reader()})
		batchBytes += files[i].Size
	}
	size := incrementalBytes(len(sources), batchBytes, entries)
	if size > maxIncrementalBytes {
		return nil, nil, fmt.Sprintf("the incremental snapshot would be %d bytes, above %d", size, maxIncrementalBytes)
	}
	v, err := s.cfg.Engine.NewExportView()
	if err != nil {
		return nil, nil, fmt.Sprintf("engine view: %v", err)
	}
	full, err := Size(v.ForEach, size)
	if err != nil {
		return nil, v, fmt.Sprintf("size of a full snapshot: %v", err)
	}
	if full <= size {
		return nil, v, fmt.Sprintf("a full snapshot (%d bytes) is no larger than the incremental one (%d bytes)", full, size)
	}
	_ = v.Close()
	h := IncrementalHeader{Index: snapIndex, Term: meta.GetTerm(), Base: plan.base, BaseTerm: plan.baseTerm, End: plan.end}
	s.logger.Info("sending incremental snapshot", zap.String("to", fmt.Sprintf("%x", to)), zap.Uint64("index", snapIndex),
		zap.Uint64("match", match), zap.Uint64("base", plan.base), zap.Uint64("end", plan.end),
		zap.Int("batches", len(sources)), zap.Int("entries", len(entries)), zap.Int64("bytes", size),
		zap.String("full-snapshot-bytes", fmt.Sprintf("> %d", size)))
	keep = true
	pr2, pw := io.Pipe()
	go func() {
		_, err := WriteIncremental(pw, h, sources, entries)
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
func (s *Snapshotter) receiveIncremental(msg *raftpb.Message, r io.Reader) error {
	meta := msg.GetSnapshot().GetMetadata()
	inc, err := ReadIncremental(r, maxIncrementalBytes)
	if err != nil {
		return err
	}
	if inc.Index != meta.GetIndex() || inc.Term != meta.GetTerm() {
		return fmt.Errorf("incremental snapshot stream for index %d term %d, the message's is %d term %d",
			inc.Index, inc.Term, meta.GetIndex(), meta.GetTerm())
	}
	applied := s.cfg.Store.AppliedIndex()
	first, err := s.cfg.Log.FirstIndex()
	if err != nil {
		return err
	}
	last, err := s.cfg.Log.LastIndex()
	if err != nil {
		return err
	}
	if err := checkCatchUp(applied, first, last, s.cfg.Log.Term, inc.Base, inc.BaseTerm); err != nil {
		s.metrics.refused.Inc()
		s.logger.Warn("refused incremental snapshot", zap.Uint64("index", inc.Index), zap.Uint64("base", inc.Base), zap.Error(err))
		return fmt.Errorf("%w: %w", errRefused, err)
	}
	s.stage(inc.Index, stagedSnapshot{inc: inc})
	s.metrics.received.WithLabelValues(KindIncremental).Inc()
	s.metrics.receivedBytes.WithLabelValues(KindIncremental).Add(float64(inc.Bytes))
	s.logger.Info("received incremental snapshot", zap.Uint64("index", inc.Index), zap.Uint64("applied", applied),
		zap.Uint64("base", inc.Base), zap.Uint64("end", inc.End), zap.Int("batches", len(inc.Batches)),
		zap.Int64("batch-bytes", inc.BatchBytes), zap.Int("entries", len(inc.Entries)), zap.Int64("bytes", inc.Bytes))
	return nil
}

// Durable implements apply.Installer: once the applier applied an
// incremental install's catch-up, the engine, whose commits are not synced
// (its WAL is off), must hold the new state durably before the node
// restarts the log after the snapshot (docs/design.md, durability rule 4),
// as an ingested full snapshot does. Without this flush a crash lost the
// install while the log had forgotten the entries before it.
func (s *Snapshotter) Durable(index uint64) error {
	if err := s.cfg.Engine.Flush(); err != nil {
		return fmt.Errorf("flush the engine after an incremental snapshot to %d: %w", index, err)
	}
	if d := s.cfg.Engine.DurableIndex(); d < index {
		return fmt.Errorf("engine durable at %d after flushing an incremental snapshot to %d", d, index)
	}
	return nil
}
