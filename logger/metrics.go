package logger

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// The logger's HTTP endpoints, served on its client URLs beside the logger
// API (transport.SplitListener sends HTTP/1.x connections here, gRPC ones
// to the API), as a strata member serves /metrics and /health beside the
// etcd API:
//
//   - /metrics: Prometheus text, every metric per cluster (label
//     cluster_id, hex as etcdctl prints it), named in etcd's manner
//     (subsystem, unit, _total for counters) under strata_logger_:
//     entries and bytes logged, last, commit and leader-commit indexes,
//     lag, log bytes, fsyncs and their time, truncations, gaps, whether a
//     leader is heard; and
//     Go's process and runtime collectors, as etcd exposes them.
//   - /health: etcd's JSON ({"health":"true","reason":""}), 200 when every
//     cluster's learner heard from a leader within HealthTimeout; else 503
//     with health "false" and the clusters that did not in the reason, as
//     etcd answers 503 without a leader.

// defaultHealthTimeout is Config.HealthTimeout's default: a few election
// timeouts of a default strata member (1 s), so that one lost heartbeat
// does not fail /health.
const defaultHealthTimeout = 3 * time.Second

// metricDesc is one per-cluster metric: its description and how to read it.
type metricDesc struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	read func(*clusterMetrics) float64
}

// clusterMetrics is one cluster's values at a scrape.
type clusterMetrics struct {
	st          *ClusterStatus
	entries     uint64
	bytes       uint64
	truncations uint64
	fsyncs      uint64
	fsyncTime   time.Duration
	heard       time.Time
}

func newDesc(name, help string, typ prometheus.ValueType, read func(*clusterMetrics) float64) metricDesc {
	return metricDesc{desc: prometheus.NewDesc(name, help, []string{"cluster_id"}, nil), typ: typ, read: read}
}

var loggerMetrics = []metricDesc{
	newDesc("strata_logger_entries_logged_total", "Entries the logger appended (fsynced) to the cluster's log.",
		prometheus.CounterValue, func(m *clusterMetrics) float64 { return float64(m.entries) }),
	newDesc("strata_logger_logged_bytes_total", "Bytes of entry data the logger appended (fsynced) to the cluster's log.",
		prometheus.CounterValue, func(m *clusterMetrics) float64 { return float64(m.bytes) }),
	newDesc("strata_logger_first_index", "The first index of the cluster's log the logger holds.",
		prometheus.GaugeValue, func(m *clusterMetrics) float64 { return float64(m.st.FirstIndex) }),
	newDesc("strata_logger_last_index", "The last index of the cluster's log the logger holds durably.",
		prometheus.GaugeValue, func(m *clusterMetrics) float64 { return float64(m.st.LastIndex) }),
	newDesc("strata_logger_commit_index", "The commit index the logger holds entries up to.",
		prometheus.GaugeValue, func(m *clusterMetrics) float64 { return float64(m.st.CommitIndex) }),
	newDesc("strata_logger_leader_commit_index", "The leader's commit index as the logger last heard it in an append.",
		prometheus.GaugeValue, func(m *clusterMetrics) float64 { return float64(m.st.LeaderCommit) }),
	newDesc("strata_logger_lag_entries", "The leader's commit index as last heard less the last index held (0 when caught up).",
		prometheus.GaugeValue, func(m *clusterMetrics) float64 { return float64(m.st.Lag) }),
	newDesc("strata_logger_log_bytes", "Bytes of the cluster's log on the logger's disk.",
		prometheus.GaugeValue, func(m *clusterMetrics) float64 { return float64(m.st.Bytes) }),
	newDesc("strata_logger_truncations_total", "Truncations of the cluster's log at the voters' request since the logger started.",
		prometheus.CounterValue, func(m *clusterMetrics) float64 { return float64(m.truncations) }),
	newDesc("strata_logger_gaps_total", "Gaps recorded in the cluster's log (a snapshot from the leader: entries never received).",
		prometheus.CounterValue, func(m *clusterMetrics) float64 { return float64(len(m.st.Gaps)) }),
	newDesc("strata_logger_fsyncs_total", "fdatasyncs of the cluster's log segments since the logger started (one per append that wrote).",
		prometheus.CounterValue, func(m *clusterMetrics) float64 { return float64(m.fsyncs) }),
	newDesc("strata_logger_fsync_seconds_total", "Seconds spent in those fdatasyncs (divided by strata_logger_fsyncs_total: the mean fsync time).",
		prometheus.CounterValue, func(m *clusterMetrics) float64 { return m.fsyncTime.Seconds() }),
	newDesc("strata_logger_compacted_entries", "Entries of the cluster's log that log compaction replaced with compacted batches the logger holds (--log-compaction).",
		prometheus.GaugeValue, func(m *clusterMetrics) float64 { return float64(m.st.CompactedEntries) }),
	newDesc("strata_logger_compacted_records", "Records the compacted batches hold instead of those entries.",
		prometheus.GaugeValue, func(m *clusterMetrics) float64 { return float64(m.st.CompactedRecords) }),
	newDesc("strata_logger_compacted_bytes", "Bytes of the compacted batch files of the cluster's log on the logger's disk.",
		prometheus.GaugeValue, func(m *clusterMetrics) float64 { return float64(m.st.CompactedBytes) }),
	newDesc("strata_logger_has_leader", "Whether the logger's learner heard from a leader of the cluster within the health timeout (1) or not (0).",
		prometheus.GaugeValue, func(m *clusterMetrics) float64 {
			if m.heard.IsZero() {
				return 0
			}
			return 1
		}),
}

// collector reads every cluster's metrics at scrape time.
type collector struct{ l *Logger }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range loggerMetrics {
		ch <- d.desc
	}
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	now := c.l.cfg.Now()
	for _, id := range c.l.Clusters() {
		cl := c.l.cluster(id)
		if cl == nil {
			continue
		}
		ls := cl.log.Stats()
		m := &clusterMetrics{
			st:          cl.status(),
			entries:     cl.ln.entriesLogged.Load(),
			bytes:       cl.ln.bytesLogged.Load(),
			truncations: cl.ln.truncations.Load(),
			fsyncs:      ls.Fsyncs,
			fsyncTime:   ls.FsyncDuration,
		}
		if heard := cl.ln.cfg.Inbox.lastHeard(); !heard.IsZero() && now.Sub(heard) <= c.l.cfg.HealthTimeout {
			m.heard = heard
		}
		label := fmt.Sprintf("%x", id)
		for _, d := range loggerMetrics {
			ch <- prometheus.MustNewConstMetric(d.desc, d.typ, d.read(m), label)
		}
	}
}

// healthResult is etcd's /health body.
type healthResult struct {
	Health string `json:"health"`
	Reason string `json:"reason"`
}

// checkHealth says whether every cluster's learner heard from a leader
// within HealthTimeout, naming those that did not.
func (l *Logger) checkHealth() healthResult {
	now := l.cfg.Now()
	var silent []string
	for _, id := range l.Clusters() {
		c := l.cluster(id)
		if c == nil {
			continue
		}
		heard := c.ln.cfg.Inbox.lastHeard()
		switch {
		case heard.IsZero():
			silent = append(silent, fmt.Sprintf("%x (no leader heard yet)", id))
		case now.Sub(heard) > l.cfg.HealthTimeout:
			silent = append(silent, fmt.Sprintf("%x (no leader heard for %v)", id, now.Sub(heard).Round(time.Millisecond)))
		}
	}
	if len(silent) > 0 {
		sort.Strings(silent)
		return healthResult{Health: "false", Reason: "NO_LEADER: " + strings.Join(silent, ", ")}
	}
	return healthResult{Health: "true"}
}

// httpHandler returns the handler of the logger's HTTP endpoints.
func (l *Logger) httpHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{l}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
			return
		}
		res := l.checkHealth()
		body, _ := json.Marshal(res)
		if res.Health != "true" {
			l.lg.Warn("/health error", zap.String("output", string(body)))
			http.Error(w, string(body), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	return mux
}
