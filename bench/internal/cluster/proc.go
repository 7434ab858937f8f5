package cluster

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat. It is
// 100 on every Linux architecture Go supports; reading it needs sysconf (cgo),
// which the benchmark avoids.
const clockTicks = 100

// Sample is one reading of a server's resource counters, summed over members
// (peak RSS: the largest member).
type Sample struct {
	// At is when the sample was taken.
	At time.Time
	// CPUSeconds is user plus system CPU time since the process started.
	CPUSeconds float64
	// PeakRSSBytes is VmHWM: the peak resident set since start, or since the
	// last ResetPeakRSS.
	PeakRSSBytes int64
	// WriteBytes is /proc/PID/io write_bytes: the sizes of the page-cache
	// folios the process dirtied (an overstatement with large folios, see
	// device.go), plus direct I/O.
	WriteBytes int64
	// DeviceWriteBytes is what the block device under the cluster directory
	// has written since boot, after a syncfs (device.go); valid only if
	// DeviceKnown.
	DeviceWriteBytes int64
	// DeviceKnown is false when the directory has no block device of its
	// own or its counter could not be read.
	DeviceKnown bool
	// Fsyncs is the sum of Spec.FsyncMetrics; valid only if FsyncsKnown.
	Fsyncs float64
	// FsyncsKnown is false when the server exposes none of those metrics.
	FsyncsKnown bool
}

// Usage is what a server consumed between two samples.
type Usage struct {
	// CPUSeconds is user plus system CPU time.
	CPUSeconds float64 `json:"cpu_seconds"`
	// PeakRSSBytes is the peak resident set during the interval (if the
	// peak was reset at its start) or since start.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// WriteBytes is the write_bytes delta of /proc/PID/io: folios dirtied,
	// which overstates small writes into large folios (device.go).
	WriteBytes int64 `json:"write_bytes"`
	// DeviceWriteBytes is what the block device holding the data wrote,
	// file-system journal included, other processes' writes to it too; nil
	// when not obtainable (tmpfs, overlayfs).
	DeviceWriteBytes *int64 `json:"device_write_bytes,omitempty"`
	// Fsyncs is the number of fsyncs, or nil when not obtainable.
	Fsyncs *int64 `json:"fsyncs,omitempty"`
	// FsyncSource says where Fsyncs came from, or why it is missing.
	FsyncSource string `json:"fsync_source"`
}

// Sub returns the usage from s0 to s.
func (s Sample) Sub(s0 Sample, source string) Usage {
	u := Usage{
		CPUSeconds:   s.CPUSeconds - s0.CPUSeconds,
		PeakRSSBytes: s.PeakRSSBytes,
		WriteBytes:   s.WriteBytes - s0.WriteBytes,
		FsyncSource:  source,
	}
	if s.FsyncsKnown && s0.FsyncsKnown {
		n := int64(s.Fsyncs - s0.Fsyncs)
		u.Fsyncs = &n
	}
	if s.DeviceKnown && s0.DeviceKnown {
		n := s.DeviceWriteBytes - s0.DeviceWriteBytes
		u.DeviceWriteBytes = &n
	}
	return u
}

// FsyncSource describes how fsyncs are counted for this cluster's server.
func (c *Cluster) FsyncSource() string {
	if c.spec.Strace != "" {
		return "strace: " + strings.Join(syncCalls, ", ") + " calls of the server's threads"
	}
	if len(c.spec.FsyncMetrics) == 0 {
		return "not obtainable: the server exports no fsync counter (run with -fsync-count strace)"
	}
	return "metrics: " + strings.Join(c.spec.FsyncMetrics, " + ")
}

// ResetPeakRSS resets every member's VmHWM to its current RSS (Linux >= 4.0),
// so the next sample's peak covers only what follows. Errors are returned
// for the caller to log; a failed reset leaves the peak since start.
func (c *Cluster) ResetPeakRSS() error {
	for _, m := range c.members {
		if m.cmd == nil || m.exited() {
			continue
		}
		p := fmt.Sprintf("/proc/%d/clear_refs", m.proc.Pid)
		if err := os.WriteFile(p, []byte("5"), 0); err != nil {
			return fmt.Errorf("reset peak rss: %w", err)
		}
	}
	return nil
}

// Sample reads the resource counters of every running member, and the
// device's write counter after syncing the file system (device.go).
func (c *Cluster) Sample() (Sample, error) {
	s := Sample{At: time.Now(), FsyncsKnown: len(c.spec.FsyncMetrics) > 0 || c.spec.Strace != ""}
	if c.dev != nil {
		n, err := c.dev.writtenBytes()
		if err != nil {
			c.log.Warn("device write counter not read", zap.Error(err))
		} else {
			s.DeviceWriteBytes, s.DeviceKnown = n, true
		}
	}
	for _, m := range c.members {
		if m.cmd == nil || m.exited() {
			continue
		}
		pid := m.proc.Pid
		cpu, err := readCPU(pid)
		if err != nil {
			return Sample{}, fmt.Errorf("%s member %s (did it crash? see %s): %w", c.spec.Name, m.name, m.logPath, err)
		}
		hwm, err := readStatusKB(pid, "VmHWM")
		if err != nil {
			return Sample{}, err
		}
		wb, err := readIOField(pid, "write_bytes")
		if err != nil {
			return Sample{}, err
		}
		s.CPUSeconds += cpu
		s.PeakRSSBytes = max(s.PeakRSSBytes, hwm)
		s.WriteBytes += wb
		switch {
		case m.trace != nil:
			n, err := m.trace.count()
			if err != nil {
				return Sample{}, err
			}
			s.Fsyncs += float64(n)
		case s.FsyncsKnown:
			v, found, err := scrapeCounters(m.clientURL+"/metrics", c.spec.FsyncMetrics)
			if err != nil || !found {
				s.FsyncsKnown = false
			}
			s.Fsyncs += v
		}
	}
	return s, nil
}

// ProcStats is a light reading of a server's processes, summed over
// members: no file-system sync and no /metrics scrape, so it can be taken
// every few seconds while a load runs without disturbing it.
type ProcStats struct {
	// CPUSeconds is user plus system CPU time since the processes started.
	CPUSeconds float64
	// RSSBytes is the resident set now (VmRSS).
	RSSBytes int64
}

// ProcStats reads CPU time and resident set of every running member.
func (c *Cluster) ProcStats() (ProcStats, error) {
	var ps ProcStats
	for _, m := range c.members {
		if m.cmd == nil || m.exited() {
			continue
		}
		cpu, err := readCPU(m.proc.Pid)
		if err != nil {
			return ProcStats{}, fmt.Errorf("%s member %s (did it crash? see %s): %w", c.spec.Name, m.name, m.logPath, err)
		}
		rss, err := readStatusKB(m.proc.Pid, "VmRSS")
		if err != nil {
			return ProcStats{}, err
		}
		ps.CPUSeconds += cpu
		ps.RSSBytes += rss
	}
	return ps, nil
}

// readCPU returns utime+stime of pid in seconds.
func readCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read cpu of pid %d: %w", pid, err)
	}
	return parseStatCPU(b)
}

// parseStatCPU extracts utime+stime, in seconds, from the text of
// /proc/PID/stat. The command name (field 2) is in parentheses and may
// contain spaces, so fields are counted from the last ')'.
func parseStatCPU(b []byte) (float64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc stat: no ')' in %q", b)
	}
	f := strings.Fields(string(b[i+1:]))
	// After ')': field 3 (state) is f[0], so field k is f[k-3]:
	// utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc stat: %d fields after comm, want >= 13", len(f))
	}
	ut, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse utime %q: %w", f[11], err)
	}
	st, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse stime %q: %w", f[12], err)
	}
	return float64(ut+st) / clockTicks, nil
}

// readStatusKB returns the "key: N kB" line of /proc/PID/status in bytes.
func readStatusKB(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read status of pid %d: %w", pid, err)
	}
	v, err := findField(b, key)
	if err != nil {
		return 0, fmt.Errorf("status of pid %d: %w", pid, err)
	}
	return v * 1024, nil
}

// readIOField returns one counter of /proc/PID/io.
func readIOField(pid int, key string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, fmt.Errorf("read io of pid %d: %w", pid, err)
	}
	v, err := findField(b, key)
	if err != nil {
		return 0, fmt.Errorf("io of pid %d: %w", pid, err)
	}
	return v, nil
}

// findField parses "key: value [unit]" lines and returns key's value.
func findField(b []byte, key string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != key {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, fmt.Errorf("field %s has no value", key)
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("field %s: %w", key, err)
		}
		return v, nil
	}
	return 0, fmt.Errorf("field %s not found", key)
}

// slowFsyncBucket is the upper bound, in etcd's fsync histogram, of the
// fsyncs DiskWaits does not count as slow: 128 ms, two orders of magnitude
// above this disk's usual fdatasync and well inside etcd's 1 s warning.
const slowFsyncBucket = "0.128"

// DiskWaits is what the members' /metrics say about the time their writes
// spent waiting on the disk, summed over members; counters since start.
type DiskWaits struct {
	// Fsyncs, SlowFsyncs and FsyncSeconds read the WAL's fsync histogram
	// (etcd_disk_wal_fsync_duration_seconds, which both servers export):
	// its count, its count above slowFsyncBucket, and its sum.
	Fsyncs, SlowFsyncs, FsyncSeconds float64
	// WriteStallSeconds is the time Pebble stalled writes
	// (strata_pebble_write_stall_seconds_total; etcd has none).
	WriteStallSeconds float64
}

// Sub returns the waits between earlier and w.
func (w DiskWaits) Sub(earlier DiskWaits) DiskWaits {
	return DiskWaits{
		Fsyncs:            w.Fsyncs - earlier.Fsyncs,
		SlowFsyncs:        w.SlowFsyncs - earlier.SlowFsyncs,
		FsyncSeconds:      w.FsyncSeconds - earlier.FsyncSeconds,
		WriteStallSeconds: w.WriteStallSeconds - earlier.WriteStallSeconds,
	}
}

// DiskWaits scrapes the running members' /metrics.
func (c *Cluster) DiskWaits() (DiskWaits, error) {
	const hist = "etcd_disk_wal_fsync_duration_seconds"
	var w DiskWaits
	for _, m := range c.members {
		if m.cmd == nil || m.exited() {
			continue
		}
		text, err := scrapeText(m.clientURL + "/metrics")
		if err != nil {
			return DiskWaits{}, err
		}
		count, _ := sumMetrics(text, []string{hist + "_count"})
		fast, _ := sumMetrics(text, []string{hist + `_bucket{le="` + slowFsyncBucket + `"}`})
		sum, _ := sumMetrics(text, []string{hist + "_sum"})
		stall, _ := sumMetrics(text, []string{"strata_pebble_write_stall_seconds_total"})
		w.Fsyncs += count
		w.SlowFsyncs += count - fast
		w.FsyncSeconds += sum
		w.WriteStallSeconds += stall
	}
	return w, nil
}
