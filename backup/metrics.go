package backup

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats are the counters of a Backuper (or of every Backuper of a
// Service) since it was made, for metrics.
type Stats struct {
	// Versions and Failures count Create calls that wrote a version and
	// that failed (a Service also counts a target it could not reach);
	// LogVersions counts the versions written that were log versions.
	Versions, Failures, LogVersions uint64
	// LastVersion, LastIndex, LastSuccess and LastDuration describe the
	// last version written (zero before the first).
	LastVersion, LastIndex uint64
	LastSuccess            time.Time
	LastDuration           time.Duration
	// FilesUploaded and BytesUploaded count what the target lacked;
	// FilesReused the files the target already held.
	FilesUploaded, BytesUploaded, FilesReused uint64
	// BytesHashed counts the bytes read to hash files (unchanged tables
	// are hashed once per Backuper).
	BytesHashed uint64
	// LogEntries and LogBytes count the raft log entries archived and the
	// bytes written for them; LogLastIndex is the last entry archived;
	// LogGaps counts the archiving runs that found the member's log no
	// longer holding the next entry.
	LogEntries, LogBytes, LogLastIndex, LogGaps uint64
	// Durations is the distribution of the durations of the versions
	// written.
	Durations Histogram
}

// Histogram is a distribution of durations in seconds, as Prometheus
// keeps one.
type Histogram struct {
	// Count and Sum are the number of observations and their total.
	Count uint64
	Sum   time.Duration
	// Buckets maps each upper bound in seconds (DurationBuckets) to the
	// number of observations at or below it (cumulative).
	Buckets map[float64]uint64
}

// DurationBuckets are the upper bounds of Stats.Durations, in seconds:
// etcd's etcd_debugging_snap_save_total_duration_seconds buckets (1 ms to
// 8 s, doubling), extended to about 2 hours, since a version of a large
// engine to a remote target takes minutes.
var DurationBuckets = prometheus.ExponentialBuckets(0.001, 2, 24)

// counters are the atomic state behind Stats.
type counters struct {
	versions, failures, logVersions     atomic.Uint64
	lastVersion, lastIndex              atomic.Uint64
	lastSuccessUnixNano, lastDurationNs atomic.Int64
	filesUploaded, bytesUploaded        atomic.Uint64
	filesReused, bytesHashed            atomic.Uint64
	logEntries, logBytes                atomic.Uint64
	logLastIndex, logGaps               atomic.Uint64

	hmu sync.Mutex // guards the histogram
	// durationCounts[i] counts versions of at most DurationBuckets[i]
	// seconds and more than the bound before (not cumulative).
	durationCounts [24]uint64
	durationCount  uint64
	durationSum    time.Duration
}

// succeeded records version m, written in d.
func (c *counters) succeeded(m *Manifest, d time.Duration) {
	c.versions.Add(1)
	if m.IsLog() {
		c.logVersions.Add(1)
	}
	c.lastVersion.Store(m.Version)
	c.lastIndex.Store(m.RaftIndex)
	c.lastSuccessUnixNano.Store(m.Created.UnixNano())
	c.lastDurationNs.Store(int64(d))
	c.hmu.Lock()
	defer c.hmu.Unlock()
	c.durationCount++
	c.durationSum += d
	for i, bound := range DurationBuckets {
		if d.Seconds() <= bound {
			c.durationCounts[i]++
			break
		}
	}
}

// read returns the counters as Stats.
func (c *counters) read() Stats {
	st := Stats{
		Versions: c.versions.Load(), Failures: c.failures.Load(), LogVersions: c.logVersions.Load(),
		LastVersion: c.lastVersion.Load(), LastIndex: c.lastIndex.Load(),
		LastDuration:  time.Duration(c.lastDurationNs.Load()),
		FilesUploaded: c.filesUploaded.Load(), BytesUploaded: c.bytesUploaded.Load(),
		FilesReused: c.filesReused.Load(), BytesHashed: c.bytesHashed.Load(),
		LogEntries: c.logEntries.Load(), LogBytes: c.logBytes.Load(), LogLastIndex: c.logLastIndex.Load(), LogGaps: c.logGaps.Load(),
	}
	if ns := c.lastSuccessUnixNano.Load(); ns != 0 {
		st.LastSuccess = time.Unix(0, ns).UTC()
	}
	c.hmu.Lock()
	defer c.hmu.Unlock()
	st.Durations = Histogram{Count: c.durationCount, Sum: c.durationSum, Buckets: make(map[float64]uint64, len(DurationBuckets))}
	var cum uint64
	for i, bound := range DurationBuckets {
		cum += c.durationCounts[i]
		st.Durations.Buckets[bound] = cum
	}
	return st
}

// Collector turns a Service's Stats into metrics at scrape time.
type Collector struct {
	stats func() Stats
}

// NewCollector returns the collector of stats' readings (Service.Stats),
// to register in the member's registry.
func NewCollector(stats func() Stats) *Collector { return &Collector{stats: stats} }

var (
	descLastSuccess = prometheus.NewDesc("strata_backup_last_success_timestamp_seconds",
		"Unix time of the last backup version written (0 before the first).", nil, nil)
	descLastDuration = prometheus.NewDesc("strata_backup_last_duration_seconds",
		"How long the last backup version took: checkpoint, hashing, uploads and manifest.", nil, nil)
	descLastVersion = prometheus.NewDesc("strata_backup_last_version",
		"The version number of the last backup version written.", nil, nil)
	descLastIndex = prometheus.NewDesc("strata_backup_last_raft_index",
		"The raft index the last backup version holds.", nil, nil)
	descVersions = prometheus.NewDesc("strata_backup_versions_total",
		"Backup versions written since start.", nil, nil)
	descLogVersions = prometheus.NewDesc("strata_backup_log_versions_total",
		"Backup versions written since start that were log versions (a files version and the raft log after it).", nil, nil)
	descFailures = prometheus.NewDesc("strata_backup_failures_total",
		"Backup versions that failed since start (the next one resumes the upload).", nil, nil)
	descBytesUploaded = prometheus.NewDesc("strata_backup_uploaded_bytes_total",
		"Bytes of engine files uploaded: the files the target lacked.", nil, nil)
	descFilesUploaded = prometheus.NewDesc("strata_backup_uploaded_files_total",
		"Engine files uploaded: the files the target lacked.", nil, nil)
	descFilesReused = prometheus.NewDesc("strata_backup_reused_files_total",
		"Engine files a version named that the target already held (not uploaded again).", nil, nil)
	descBytesHashed = prometheus.NewDesc("strata_backup_hashed_bytes_total",
		"Bytes read to hash engine files (an unchanged table is hashed once).", nil, nil)
	descLogEntries = prometheus.NewDesc("strata_backup_log_archived_entries_total",
		"Raft log entries archived to the backup target (point-in-time restore).", nil, nil)
	descLogBytes = prometheus.NewDesc("strata_backup_log_archived_bytes_total",
		"Bytes of archived raft log objects written.", nil, nil)
	descLogLast = prometheus.NewDesc("strata_backup_log_archived_index",
		"The last raft index archived: a restore can reach the revision of this entry.", nil, nil)
	descLogGaps = prometheus.NewDesc("strata_backup_log_gaps_total",
		"Log archiving runs that found the raft log no longer holding the next entry (a restore cannot cross the gap).", nil, nil)
	descSnapSave = prometheus.NewDesc("etcd_debugging_snap_save_total_duration_seconds",
		"The total latency distributions of save called by snapshot (strata: a backup version, from checkpoint to manifest; strata writes no raft snapshot file, whose save etcd times).", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLastSuccess, descLastDuration, descLastVersion, descLastIndex, descVersions, descLogVersions,
		descFailures, descBytesUploaded, descFilesUploaded, descFilesReused, descBytesHashed, descLogEntries, descLogBytes, descLogLast,
		descLogGaps, descSnapSave} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	last := 0.0
	if !st.LastSuccess.IsZero() {
		last = float64(st.LastSuccess.UnixNano()) / 1e9
	}
	gauge(descLastSuccess, last)
	gauge(descLastDuration, st.LastDuration.Seconds())
	gauge(descLastVersion, float64(st.LastVersion))
	gauge(descLastIndex, float64(st.LastIndex))
	counter(descVersions, st.Versions)
	counter(descLogVersions, st.LogVersions)
	counter(descFailures, st.Failures)
	counter(descBytesUploaded, st.BytesUploaded)
	counter(descFilesUploaded, st.FilesUploaded)
	counter(descFilesReused, st.FilesReused)
	counter(descBytesHashed, st.BytesHashed)
	counter(descLogEntries, st.LogEntries)
	counter(descLogBytes, st.LogBytes)
	gauge(descLogLast, float64(st.LogLastIndex))
	counter(descLogGaps, st.LogGaps)
	h := st.Durations
	ch <- prometheus.MustNewConstHistogram(descSnapSave, h.Count, h.Sum.Seconds(), h.Buckets)
}
