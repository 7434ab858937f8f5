package server

// Prometheus metrics for /metrics, under etcd's names where etcd's
// dashboards and alerts look for them, plus strata's own (strata_*) for the
// raft log and the engine.
//
// Counters that components already keep (the log's fsyncs, the node's
// leader changes, the indexes) are read at scrape time through
// MetricsSource, so the write path pays nothing for them; only what exists
// nowhere else (pending and failed proposals, engine commit latency, gRPC
// calls) is counted here.

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/raftlog"
)

// StateSource is the member's components, read at scrape time from the
// scraping goroutine: each method must be safe from any goroutine.
type StateSource struct {
	MemberID uint64
	Raft     interface {
		Leader() uint64
		LeaderChanges() uint64
		CommitIndex() uint64
		// IncomingWaits counts the appends a leader held for writes on
		// their way, and how many of those waits ran to their bound
		// (node/incoming.go).
		IncomingWaits() (waits, timeouts uint64)
	}
	Applier interface{ AppliedIndex() uint64 }
	Store   interface {
		Rev() int64
		CompactRev() int64
	}
	// Engine's applied and durable index are docs/design.md's durability
	// rule 3; DiskSize is its size on disk.
	Engine interface {
		DiskSize() int64
		AppliedIndex() uint64
		DurableIndex() uint64
	}
	Log interface {
		Stats() raftlog.Stats
		FsyncHistogram() raftlog.Histogram
		FirstIndex() (uint64, error)
		LastIndex() (uint64, error)
	}
}

// Metrics is one member's metrics registry. It is per member, not
// Prometheus's global registry, so that tests can run several members in
// one process.
//
// Concurrency: every method is safe from any goroutine.
type Metrics struct {
	reg *prometheus.Registry

	proposalsPending prometheus.Gauge
	proposalsFailed  prometheus.Counter
	backendCommit    prometheus.Histogram
	grpcStarted      *prometheus.CounterVec
	grpcHandled      *prometheus.CounterVec
	healthSuccess    prometheus.Counter
	healthFailures   prometheus.Counter
	checkGauge       *prometheus.GaugeVec
	checkCounter     *prometheus.CounterVec
}

// NewMetrics registers the metrics that requests and commits observe, and
// Go's runtime and process collectors (etcd exposes go_* and process_*
// too). The member's state (raft, the store, the log, the engine) is read
// by a StateCollector, registered once those exist.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		proposalsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "etcd_server_proposals_pending", Help: "The current number of pending proposals to commit.",
		}),
		proposalsFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "etcd_server_proposals_failed_total", Help: "The total number of failed proposals seen.",
		}),
		backendCommit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "etcd_disk_backend_commit_duration_seconds",
			Help:    "The latency distributions of commit called by backend (strata: one engine batch per apply, unsynced).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		grpcStarted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_started_total", Help: "Total number of RPCs started on the server.",
		}, []string{"grpc_type", "grpc_service", "grpc_method"}),
		grpcHandled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_handled_total", Help: "Total number of RPCs completed on the server, regardless of success or failure.",
		}, []string{"grpc_type", "grpc_service", "grpc_method", "grpc_code"}),
		healthSuccess: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "etcd_server_health_success", Help: "The total number of successful health checks",
		}),
		healthFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "etcd_server_health_failures", Help: "The total number of failed health checks",
		}),
		checkGauge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "etcd_server_healthcheck", Help: "The result of each kind of healthcheck.",
		}, []string{"type", "name"}),
		checkCounter: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "etcd_server_healthchecks_total", Help: "The total number of each kind of healthcheck.",
		}, []string{"type", "name", "status"}),
	}
	m.reg.MustRegister(m.proposalsPending, m.proposalsFailed, m.backendCommit, m.grpcStarted, m.grpcHandled,
		m.healthSuccess, m.healthFailures, m.checkGauge, m.checkCounter,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the registry in Prometheus's text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registry returns the registry, for components that add their own.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ProposalStarted counts a proposal as pending; call the returned function
// with the proposal's outcome when it ends. A nil Metrics counts nothing.
func (m *Metrics) ProposalStarted() func(err error) {
	if m == nil {
		return func(error) {}
	}
	m.proposalsPending.Inc()
	return func(err error) {
		m.proposalsPending.Dec()
		if err != nil {
			m.proposalsFailed.Inc()
		}
	}
}

// ObserveBackendCommit records one engine batch commit's duration.
func (m *Metrics) ObserveBackendCommit(d time.Duration) {
	if m != nil {
		m.backendCommit.Observe(d.Seconds())
	}
}

// observeHealth counts one /health answer.
func (m *Metrics) observeHealth(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.healthSuccess.Inc()
	} else {
		m.healthFailures.Inc()
	}
}

// observeCheck records one livez or readyz check's result.
func (m *Metrics) observeCheck(kind, name string, ok bool) {
	if m == nil {
		return
	}
	status, v := "success", 1.0
	if !ok {
		status, v = "error", 0
	}
	m.checkGauge.WithLabelValues(kind, name).Set(v)
	m.checkCounter.WithLabelValues(kind, name, status).Inc()
}

// GRPCServerOptions returns interceptors that count RPCs as
// go-grpc-prometheus does (grpc_server_started_total and
// grpc_server_handled_total with its labels), the two that etcd's dashboards
// chart. A nil Metrics returns none.
func (m *Metrics) GRPCServerOptions() []grpc.ServerOption {
	if m == nil {
		return nil
	}
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		service, method := splitMethod(info.FullMethod)
		m.grpcStarted.WithLabelValues("unary", service, method).Inc()
		resp, err := handler(ctx, req)
		m.grpcHandled.WithLabelValues("unary", service, method, status.Code(err).String()).Inc()
		return resp, err
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		service, method := splitMethod(info.FullMethod)
		typ := streamType(info)
		m.grpcStarted.WithLabelValues(typ, service, method).Inc()
		err := handler(srv, ss)
		m.grpcHandled.WithLabelValues(typ, service, method, status.Code(err).String()).Inc()
		return err
	}
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream)}
}

func splitMethod(full string) (service, method string) {
	full = strings.TrimPrefix(full, "/")
	if i := strings.LastIndex(full, "/"); i >= 0 {
		return full[:i], full[i+1:]
	}
	return "unknown", full
}

func streamType(info *grpc.StreamServerInfo) string {
	switch {
	case info.IsClientStream && info.IsServerStream:
		return "bidi_stream"
	case info.IsClientStream:
		return "client_stream"
	default:
		return "server_stream"
	}
}

// StateCollector turns a StateSource's readings into etcd's and strata's
// metrics at scrape time.
type StateCollector struct {
	src StateSource
}

// NewStateCollector returns the collector of src's readings, to register
// in the member's registry (Metrics.Registry).
func NewStateCollector(src StateSource) *StateCollector {
	return &StateCollector{src: src}
}

// metricDesc is one metric read from the source.
type metricDesc struct {
	name, help string
	kind       prometheus.ValueType
}

var (
	descHasLeader        = metricDesc{"etcd_server_has_leader", "Whether or not a leader exists. 1 is existence, 0 is not.", prometheus.GaugeValue}
	descIsLeader         = metricDesc{"etcd_server_is_leader", "Whether or not this member is a leader. 1 if is, 0 otherwise.", prometheus.GaugeValue}
	descLeaderChanges    = metricDesc{"etcd_server_leader_changes_seen_total", "The number of leader changes seen.", prometheus.CounterValue}
	descCommitted        = metricDesc{"etcd_server_proposals_committed_total", "The total number of consensus proposals committed (the raft commit index, as etcd reports it).", prometheus.GaugeValue}
	descApplied          = metricDesc{"etcd_server_proposals_applied_total", "The total number of consensus proposals applied (the applied index, as etcd reports it).", prometheus.GaugeValue}
	descDBSize           = metricDesc{"etcd_mvcc_db_total_size_in_bytes", "Total size of the underlying database physically allocated in bytes.", prometheus.GaugeValue}
	descDBSizeInUse      = metricDesc{"etcd_mvcc_db_total_size_in_use_in_bytes", "Total size of the underlying database logically in use in bytes (strata: the engine's size on disk).", prometheus.GaugeValue}
	descCurrentRev       = metricDesc{"etcd_debugging_mvcc_current_revision", "The current revision of store.", prometheus.GaugeValue}
	descCompactRev       = metricDesc{"etcd_debugging_mvcc_compact_revision", "The revision of the last compaction in store.", prometheus.GaugeValue}
	descLogSegments      = metricDesc{"strata_raftlog_segments", "Live segment files of the raft log.", prometheus.GaugeValue}
	descLogBytes         = metricDesc{"strata_raftlog_bytes", "Bytes of records in the raft log's live segments.", prometheus.GaugeValue}
	descLogDiskBytes     = metricDesc{"strata_raftlog_disk_bytes", "Bytes the raft log's live segments occupy on disk, preallocation included.", prometheus.GaugeValue}
	descLogAppends       = metricDesc{"strata_raftlog_appends_total", "Appends to the raft log that wrote (one per raft Ready with entries or a HardState).", prometheus.CounterValue}
	descLogEntries       = metricDesc{"strata_raftlog_entries_total", "Entries appended to the raft log.", prometheus.CounterValue}
	descLogWritten       = metricDesc{"strata_raftlog_written_bytes_total", "Bytes written to the raft log.", prometheus.CounterValue}
	descLogFsyncs        = metricDesc{"strata_raftlog_fsyncs_total", "fdatasyncs of raft log segments.", prometheus.CounterValue}
	descLogFirst         = metricDesc{"strata_raftlog_first_index", "The first index the raft log holds.", prometheus.GaugeValue}
	descLogLast          = metricDesc{"strata_raftlog_last_index", "The last index the raft log holds.", prometheus.GaugeValue}
	descLogCompactions   = metricDesc{"strata_raftlog_compactions_total", "Compacted batch files written by log compaction since start (--log-compaction).", prometheus.CounterValue}
	descLogSkipped       = metricDesc{"strata_raftlog_compactions_skipped_total", "Passes of log compaction that left a run of entries in the log since start: it holds a configuration change, auth or alarm request, or revisions that physical revision compaction has reached (docs/log-compaction.md).", prometheus.CounterValue}
	descLogBatchFiles    = metricDesc{"strata_raftlog_batch_files", "Live compacted batch files of the raft log.", prometheus.GaugeValue}
	descLogBatchBytes    = metricDesc{"strata_raftlog_batch_bytes", "Bytes of the live compacted batch files.", prometheus.GaugeValue}
	descLogBatchCommands = metricDesc{"strata_raftlog_batch_commands", "Log entries the live compacted batch files stand for.", prometheus.GaugeValue}
	descLogBatchRecords  = metricDesc{"strata_raftlog_batch_records", "Records the live compacted batch files hold (one per key version kept, or kept entry).", prometheus.GaugeValue}
	descEngineApplied    = metricDesc{"strata_engine_applied_index", "The raft index of the engine's last committed batch.", prometheus.GaugeValue}
	descEngineDurable    = metricDesc{"strata_engine_durable_index", "The engine's durable index: every batch at or below it is in durable files.", prometheus.GaugeValue}
	descIncomingWaits    = metricDesc{"strata_raft_incoming_waits_total", "Appends the leader held for client writes counted on their way to raft (docs/write-path.md, decision 7).", prometheus.CounterValue}
	descIncomingTimeouts = metricDesc{"strata_raft_incoming_wait_timeouts_total", "Of those holds, the ones that ran to their bound (1 ms) before the counted writes arrived.", prometheus.CounterValue}

	fsyncDesc    = prometheus.NewDesc("etcd_disk_wal_fsync_duration_seconds", "The latency distributions of fsync called by WAL (strata: the raft log's fdatasyncs).", nil, nil)
	serverIDDesc = prometheus.NewDesc("etcd_server_id", "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.", []string{"server_id"}, nil)
	versionDesc  = prometheus.NewDesc("etcd_server_version", "Which version is running. 1 for 'server_version' label with current version.", []string{"server_version"}, nil)

	sourceDescs = map[metricDesc]*prometheus.Desc{}
)

func init() {
	for _, d := range []metricDesc{
		descHasLeader, descIsLeader, descLeaderChanges, descCommitted, descApplied, descDBSize, descDBSizeInUse,
		descCurrentRev, descCompactRev, descLogSegments, descLogBytes, descLogDiskBytes, descLogAppends,
		descLogEntries, descLogWritten, descLogFsyncs, descLogFirst, descLogLast, descLogCompactions, descLogSkipped,
		descLogBatchFiles, descLogBatchBytes, descLogBatchCommands, descLogBatchRecords, descEngineApplied, descEngineDurable,
		descIncomingWaits, descIncomingTimeouts,
	} {
		sourceDescs[d] = prometheus.NewDesc(d.name, d.help, nil, nil)
	}
}

// Describe implements prometheus.Collector.
func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range sourceDescs {
		ch <- d
	}
	ch <- fsyncDesc
	ch <- serverIDDesc
	ch <- versionDesc
}

// Collect implements prometheus.Collector.
func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src
	emit := func(d metricDesc, v float64) {
		ch <- prometheus.MustNewConstMetric(sourceDescs[d], d.kind, v)
	}
	leader := s.Raft.Leader()
	emit(descHasLeader, boolFloat(leader != 0))
	emit(descIsLeader, boolFloat(leader != 0 && leader == s.MemberID))
	emit(descLeaderChanges, float64(s.Raft.LeaderChanges()))
	waits, timeouts := s.Raft.IncomingWaits()
	emit(descIncomingWaits, float64(waits))
	emit(descIncomingTimeouts, float64(timeouts))
	emit(descCommitted, float64(s.Raft.CommitIndex()))
	emit(descApplied, float64(s.Applier.AppliedIndex()))
	size := float64(s.Engine.DiskSize())
	emit(descDBSize, size)
	emit(descDBSizeInUse, size)
	emit(descCurrentRev, float64(s.Store.Rev()))
	emit(descCompactRev, float64(s.Store.CompactRev()))
	st := s.Log.Stats()
	emit(descLogSegments, float64(st.Segments))
	emit(descLogBytes, float64(st.Bytes))
	emit(descLogDiskBytes, float64(st.DiskBytes))
	emit(descLogAppends, float64(st.Appends))
	emit(descLogEntries, float64(st.Entries))
	emit(descLogWritten, float64(st.BytesWritten))
	emit(descLogFsyncs, float64(st.Fsyncs))
	first, _ := s.Log.FirstIndex()
	last, _ := s.Log.LastIndex()
	emit(descLogFirst, float64(first))
	emit(descLogLast, float64(last))
	emit(descLogCompactions, float64(st.BatchesWritten))
	emit(descLogSkipped, float64(st.CompactionsSkipped))
	emit(descLogBatchFiles, float64(st.BatchFiles))
	emit(descLogBatchBytes, float64(st.BatchBytes))
	emit(descLogBatchCommands, float64(st.BatchCommands))
	emit(descLogBatchRecords, float64(st.BatchRecords))
	emit(descEngineApplied, float64(s.Engine.AppliedIndex()))
	emit(descEngineDurable, float64(s.Engine.DurableIndex()))

	h := s.Log.FsyncHistogram()
	ch <- prometheus.MustNewConstHistogram(fsyncDesc, h.Count, h.Sum.Seconds(), h.Buckets)
	ch <- prometheus.MustNewConstMetric(serverIDDesc, prometheus.GaugeValue, 1, formatID(s.MemberID))
	ch <- prometheus.MustNewConstMetric(versionDesc, prometheus.GaugeValue, 1, EtcdVersion)
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func formatID(id uint64) string { return strconv.FormatUint(id, 16) }
