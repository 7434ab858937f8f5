// Package report holds the benchmark's results and renders them: a JSON file
// (the source of truth, rewritten after every measurement so an interrupted
// run keeps what it measured), a Markdown table with strata/etcd ratios, and
// PNG plots (throughput against latency, latency CDFs).
//
// Results are grouped by Result.Key: the same workload, connection and client
// counts and record count on different servers. Within a group the server
// named Baseline ("etcd") is the denominator of every ratio.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/strata-kv/strata/bench/internal/cluster"
)

// Baseline is the server every ratio divides by.
const Baseline = "etcd"

// Report is one benchmark run.
type Report struct {
	// Started is when the run began (UTC).
	Started time.Time `json:"started"`
	// Command is the exact command line.
	Command string `json:"command"`
	// Machine describes where it ran.
	Machine Machine `json:"machine"`
	// Servers lists the server flavours measured.
	Servers []ServerInfo `json:"servers"`
	// Results are the measurements, in the order taken.
	Results []Result `json:"results"`
	// Notes are caveats gathered during the run (missing servers, tmpfs).
	Notes []string `json:"notes,omitempty"`
}

// Machine describes the host.
type Machine struct {
	NProc     int    `json:"nproc"`
	CPUModel  string `json:"cpu_model"`
	Memory    string `json:"memory"`
	Kernel    string `json:"kernel"`
	Disk      string `json:"disk"`
	GoVersion string `json:"go_version"`
	// LoadStart and LoadEnd are /proc/loadavg at the start and end of the
	// run: on a shared machine they say how much else was running.
	LoadStart string `json:"loadavg_start"`
	LoadEnd   string `json:"loadavg_end"`
}

// ServerInfo describes one server flavour.
type ServerInfo struct {
	Name    string `json:"name"`
	Binary  string `json:"binary"`
	Version string `json:"version"`
	// Command is the full command line of the first member started, with
	// the ports and directories of that run.
	Command []string `json:"command,omitempty"`
}

// Latency summarises a histogram in milliseconds.
type Latency struct {
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

// CDFPoint is one point of a latency CDF.
type CDFPoint struct {
	// Percentile is in [0, 100].
	Percentile float64 `json:"pct"`
	// Millis is the latency at that percentile.
	Millis float64 `json:"ms"`
}

// Result is one measurement: one workload configuration on one server.
type Result struct {
	Server   string `json:"server"`
	Workload string `json:"workload"`
	// Phase is "run" for a timed workload, "restart" for a kill -9 restart.
	Phase   string `json:"phase"`
	Conns   int    `json:"conns,omitempty"`
	Clients int    `json:"clients,omitempty"`
	// Records is the number of keys preloaded (YCSB, restart).
	Records int64 `json:"records,omitempty"`
	// Total is the number of operations requested.
	Total      int64      `json:"total,omitempty"`
	Ops        int64      `json:"ops"`
	Errors     int64      `json:"errors"`
	FirstError string     `json:"first_error,omitempty"`
	Seconds    float64    `json:"seconds"`
	Throughput float64    `json:"ops_per_sec"`
	Latency    Latency    `json:"latency"`
	CDF        []CDFPoint `json:"cdf,omitempty"`
	// Usage is the server's resource use during the run.
	Usage cluster.Usage `json:"usage"`
	// DataDirBytes is the space the data (and log) directories occupy on
	// disk after the run, as du counts it.
	DataDirBytes int64 `json:"data_dir_bytes"`
	// DataDirApparentBytes is the sum of the file lengths in the same
	// directories (preallocated space not counted beyond each length).
	DataDirApparentBytes int64 `json:"data_dir_apparent_bytes"`
	// RestartSeconds is the time from exec to the first successful
	// linearizable read after kill -9 (restart phase only).
	RestartSeconds float64 `json:"restart_seconds,omitempty"`
	// DataDirBytesBefore is DataDirBytes before the measured window
	// (defrag phase: after the load and the revision compaction).
	DataDirBytesBefore int64 `json:"data_dir_bytes_before,omitempty"`
	// StallSeconds is the longest interval without a completed write
	// (defrag phase).
	StallSeconds float64 `json:"stall_seconds,omitempty"`
	// DefragSeconds is how long the Defragment calls took to return
	// (defrag phase).
	DefragSeconds float64 `json:"defrag_seconds,omitempty"`
	// Round is the measurement's round in an interleaved run (-rounds N,
	// N > 1), counted from 1; 0 in a run of one round. Results that differ
	// only in Round share a Key: the table shows their median and spread.
	Round int `json:"round,omitempty"`
	// Load1 is the machine's 1-minute load average when the measurement
	// started (/proc/loadavg); 0 when unknown.
	Load1 float64 `json:"load1,omitempty"`
}

// Key groups results that are comparable across servers.
func (r Result) Key() string {
	return fmt.Sprintf("%s|%s|%d|%d|%d", r.Phase, r.Workload, r.Conns, r.Clients, r.Records)
}

// Summarize fills the latency fields of r from h (microseconds).
func (r *Result) Summarize(h *hdrhistogram.Histogram) {
	ms := func(us int64) float64 { return float64(us) / 1000 }
	r.Latency = Latency{
		P50:  ms(h.ValueAtQuantile(50)),
		P90:  ms(h.ValueAtQuantile(90)),
		P99:  ms(h.ValueAtQuantile(99)),
		Max:  ms(h.Max()),
		Mean: h.Mean() / 1000,
	}
	r.CDF = nil
	if h.TotalCount() == 0 {
		return
	}
	for _, b := range h.CumulativeDistributionWithTicks(5) {
		if b.Count == 0 {
			continue
		}
		r.CDF = append(r.CDF, CDFPoint{Percentile: b.Quantile, Millis: ms(b.ValueAt)})
	}
}

// WriteJSON writes rep to path atomically (temporary file, rename), so a
// reader never sees half a file.
func WriteJSON(rep *Report, path string) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename report to %s: %w", path, err)
	}
	return nil
}

// ReadJSON reads a report written by WriteJSON.
func ReadJSON(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read report: %w", err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("decode report %s: %w", path, err)
	}
	return &rep, nil
}

// Render writes results.md and the plots next to each other in dir and
// returns the files written.
func Render(rep *Report, dir string) ([]string, error) {
	md := filepath.Join(dir, "results.md")
	if err := os.WriteFile(md, []byte(Markdown(rep)), 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", md, err)
	}
	pngs, err := Plot(rep, dir)
	if err != nil {
		return nil, err
	}
	return append([]string{md}, pngs...), nil
}
