package pebble

import (
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// The engine's own metrics, read from Pebble at scrape time: what an operator
// (and the benchmarks of issue 15) needs to see whether the LSM keeps up with
// the writes (L0, compaction debt, stalls) and how reads are served (block
// cache, read amplification).
var (
	descL0Files     = prometheus.NewDesc("strata_pebble_l0_files", "Tables in Pebble's L0.", nil, nil)
	descL0Sublevels = prometheus.NewDesc("strata_pebble_l0_sublevels", "Sublevels of Pebble's L0 (its read amplification).", nil, nil)
	descReadAmp     = prometheus.NewDesc("strata_pebble_read_amplification", "L0 sublevels plus non-empty levels below: tables a point read may visit.", nil, nil)
	descDebt        = prometheus.NewDesc("strata_pebble_compaction_debt_bytes", "Pebble's estimate of the bytes to compact for the LSM to be stable.", nil, nil)
	descCompactions = prometheus.NewDesc("strata_pebble_compactions_total", "Compactions since the engine opened.", nil, nil)
	descCompacted   = prometheus.NewDesc("strata_pebble_compacted_bytes_total", "Bytes written to tables by compactions since the engine opened.", nil, nil)
	descCompactTime = prometheus.NewDesc("strata_pebble_compaction_seconds_total", "Time spent in compactions since the engine opened.", nil, nil)
	descFlushes     = prometheus.NewDesc("strata_pebble_flushes_total", "Memtable flushes since the engine opened.", nil, nil)
	descFlushed     = prometheus.NewDesc("strata_pebble_flushed_bytes_total", "Bytes written to L0 tables by flushes since the engine opened.", nil, nil)
	descStalls      = prometheus.NewDesc("strata_pebble_write_stalls_total", "Write stalls (too many memtables or L0 sublevels) since the engine opened.", nil, nil)
	descStallTime   = prometheus.NewDesc("strata_pebble_write_stall_seconds_total", "Time writes were stalled since the engine opened.", nil, nil)
	descCacheSize   = prometheus.NewDesc("strata_pebble_block_cache_bytes", "Bytes in the block cache.", nil, nil)
	descCacheHits   = prometheus.NewDesc("strata_pebble_block_cache_hits_total", "Block cache hits since the engine opened.", nil, nil)
	descCacheMisses = prometheus.NewDesc("strata_pebble_block_cache_misses_total", "Block cache misses since the engine opened.", nil, nil)
	descMemtables   = prometheus.NewDesc("strata_pebble_memtable_bytes", "Bytes allocated by memtables.", nil, nil)
)

// stallClock counts write stalls from Pebble's WriteStallBegin and
// WriteStallEnd events, which come one pair at a time.
type stallClock struct {
	count   int64
	total   time.Duration
	started time.Time // zero when no stall is under way
	reason  string    // of the stall under way
}

// Describe implements prometheus.Collector.
func (e *Engine) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descL0Files, descL0Sublevels, descReadAmp, descDebt, descCompactions,
		descCompacted, descCompactTime, descFlushes, descFlushed, descStalls, descStallTime, descCacheSize,
		descCacheHits, descCacheMisses, descMemtables} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (e *Engine) Collect(ch chan<- prometheus.Metric) {
	m := e.db.Metrics()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	var compacted uint64
	for _, l := range m.Levels {
		compacted += l.TableBytesCompacted
	}
	gauge(descL0Files, float64(m.Levels[0].TablesCount))
	gauge(descL0Sublevels, float64(m.Levels[0].Sublevels))
	gauge(descReadAmp, float64(m.ReadAmp()))
	gauge(descDebt, float64(m.Compact.EstimatedDebt))
	counter(descCompactions, float64(m.Compact.Count))
	counter(descCompacted, float64(compacted))
	counter(descCompactTime, m.Compact.Duration.Seconds())
	counter(descFlushes, float64(m.Flush.Count))
	counter(descFlushed, float64(m.Levels[0].TableBytesFlushed))
	e.stallMu.Lock()
	stalls, stalled := e.stalls.count, e.stalls.total
	if !e.stalls.started.IsZero() {
		stalled += time.Since(e.stalls.started)
	}
	e.stallMu.Unlock()
	counter(descStalls, float64(stalls))
	counter(descStallTime, stalled.Seconds())
	gauge(descCacheSize, float64(m.BlockCache.Size))
	counter(descCacheHits, float64(m.BlockCache.Hits))
	counter(descCacheMisses, float64(m.BlockCache.Misses))
	gauge(descMemtables, float64(m.MemTable.Size))
}

// warnStallDuration is the write stall worth a warning: a stall holds back
// the apply of every write, so one this long is felt by clients (etcd's
// "apply request took too long" uses the same 100 ms).
const warnStallDuration = 100 * time.Millisecond

func (e *Engine) stallBegan(info pebble.WriteStallBeginInfo) {
	e.stallMu.Lock()
	defer e.stallMu.Unlock()
	e.stalls.count++
	e.stalls.started = time.Now()
	e.stalls.reason = info.Reason
}

// stallEnded closes the stall under way; one of warnStallDuration or more
// is logged with its reason (too many memtables, or L0 sublevels), which
// tells an operator whether flushes or compactions fell behind.
func (e *Engine) stallEnded() {
	e.stallMu.Lock()
	if e.stalls.started.IsZero() {
		e.stallMu.Unlock()
		return
	}
	took := time.Since(e.stalls.started)
	reason := e.stalls.reason
	e.stalls.total += took
	e.stalls.started = time.Time{}
	e.stallMu.Unlock()
	if took >= warnStallDuration {
		e.opts.Logger.Warn("pebble: write stall", zap.String("reason", reason),
			zap.Duration("took", took), zap.Duration("expected-duration", warnStallDuration))
	}
}
