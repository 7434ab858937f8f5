package raftlog

import (
	"sync/atomic"
	"time"
)

// FsyncBuckets are the upper bounds, in seconds, of the fsync latency
// histogram: etcd's etcd_disk_wal_fsync_duration_seconds buckets (1 ms,
// doubling, to 8.192 s), so that dashboards and alerts built for etcd read
// strata's histogram the same way.
var FsyncBuckets = [...]float64{
	0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064,
	0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192,
}

// Histogram is a latency distribution in Prometheus's shape.
type Histogram struct {
	// Buckets maps each upper bound of FsyncBuckets to the number of
	// observations at or below it (cumulative, as Prometheus expects).
	Buckets map[float64]uint64
	// Count is the number of observations, +Inf bucket included.
	Count uint64
	// Sum is the total of the observations.
	Sum time.Duration
}

// fsyncHistogram counts fdatasync durations per bucket without a lock: the
// writer adds, Stats readers load. A reader may see a bucket incremented
// and the sum not yet (or the reverse); scrapes tolerate that skew.
type fsyncHistogram struct {
	counts [len(FsyncBuckets) + 1]atomic.Uint64 // the last one is +Inf
	nanos  atomic.Uint64
}

func (h *fsyncHistogram) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(FsyncBuckets) && s > FsyncBuckets[i] {
		i++
	}
	h.counts[i].Add(1)
	h.nanos.Add(uint64(d))
}

func (h *fsyncHistogram) snapshot() Histogram {
	out := Histogram{Buckets: make(map[float64]uint64, len(FsyncBuckets)), Sum: time.Duration(h.nanos.Load())}
	var cum uint64
	for i, ub := range FsyncBuckets {
		cum += h.counts[i].Load()
		out.Buckets[ub] = cum
	}
	out.Count = cum + h.counts[len(FsyncBuckets)].Load()
	return out
}

// FsyncHistogram returns the distribution of the log's fdatasync
// durations, for etcd_disk_wal_fsync_duration_seconds. Safe from any
// goroutine.
func (l *Log) FsyncHistogram() Histogram { return l.stats.fsyncHist.snapshot() }
