package report

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
)

// GrowReport is a data-growth run (`bench grow`): each server, one after the
// other, on a fresh single member, written with new keys until its data
// directory reaches a size, sampled at a fixed interval.
type GrowReport struct {
	Started  time.Time    `json:"started"`
	Finished time.Time    `json:"finished,omitzero"`
	Command  string       `json:"command"`
	Machine  Machine      `json:"machine"`
	Servers  []ServerInfo `json:"servers"`
	Settings GrowSettings `json:"settings"`
	Runs     []GrowRun    `json:"runs"`
	Notes    []string     `json:"notes,omitempty"`
}

// GrowSettings are the sizes a growth run used.
type GrowSettings struct {
	KeySize   int `json:"key_size"`
	ValueSize int `json:"value_size"`
	Clients   int `json:"clients"`
	Conns     int `json:"conns"`
	// TargetBytes is the data directory size (as du counts it) at which a
	// server's run stops; TargetKeys the key count (0: no limit).
	TargetBytes int64 `json:"target_bytes"`
	TargetKeys  int64 `json:"target_keys,omitempty"`
	// IntervalSeconds is the sampling interval.
	IntervalSeconds float64 `json:"interval_seconds"`
	// QuotaBackendBytes is the --quota-backend-bytes every server got.
	QuotaBackendBytes int64 `json:"quota_backend_bytes"`
}

// GrowRun is one server's growth run.
type GrowRun struct {
	Server string `json:"server"`
	// Command is the server's command line.
	Command []string `json:"command,omitempty"`
	// InitialDataDirBytes is the data directory's size (du) before the
	// first write: etcd preallocates a 64 MiB WAL segment, for one.
	InitialDataDirBytes int64 `json:"initial_data_dir_bytes"`
	// Samples are taken every interval and once at the end.
	Samples []GrowSample `json:"samples"`
	// Keys is the number of acknowledged writes, each a new key.
	Keys       int64  `json:"keys"`
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`
	// Seconds is the writers' wall time.
	Seconds float64 `json:"seconds"`
	// Latency covers every acknowledged write of the run.
	Latency Latency `json:"latency"`
	// DataDirBytes and DataDirApparentBytes are the sizes when the writers
	// stopped (du; sum of file lengths).
	DataDirBytes         int64 `json:"data_dir_bytes"`
	DataDirApparentBytes int64 `json:"data_dir_apparent_bytes"`
	// Stop says why the writers stopped: "size", "keys", "errors",
	// "interrupted".
	Stop string `json:"stop"`
	Err  string `json:"error,omitempty"`
}

// GrowSample is one sampling interval of a growth run.
type GrowSample struct {
	// Seconds is the end of the interval, from the first write.
	Seconds float64 `json:"t_seconds"`
	// Keys is the acknowledged writes so far.
	Keys int64 `json:"keys"`
	// DataDirBytes is du of the data (and log) directories at the end of
	// the interval; DataDirApparentBytes the sum of the file lengths.
	DataDirBytes         int64 `json:"data_dir_bytes"`
	DataDirApparentBytes int64 `json:"data_dir_apparent_bytes"`
	// IntervalSeconds is the interval's length (the last one is shorter).
	IntervalSeconds float64 `json:"interval_seconds"`
	// Ops and Errors count the writes that completed in the interval.
	Ops    int64 `json:"ops"`
	Errors int64 `json:"errors"`
	// Throughput is Ops / IntervalSeconds.
	Throughput float64 `json:"ops_per_sec"`
	// P50, P99 and Max are the latencies of the interval's writes (ms).
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	// RSSBytes is the server's resident set at the end of the interval.
	RSSBytes int64 `json:"rss_bytes"`
	// CPUSeconds is the server's CPU time in the interval (user+system).
	CPUSeconds float64 `json:"cpu_seconds"`
	// Load1 is the machine's 1-minute load average at the sample.
	Load1 float64 `json:"load1"`
	// Fsyncs counts the interval's WAL fsyncs and SlowFsyncs those slower
	// than 128 ms, and FsyncSeconds is their total time, from the server's
	// fsync histogram;
	// WriteStallSeconds is the time Pebble stalled writes (strata only).
	// They tell whether a slow interval waited on the log's syncs or on
	// the engine.
	Fsyncs            float64 `json:"fsyncs"`
	SlowFsyncs        float64 `json:"slow_fsyncs"`
	FsyncSeconds      float64 `json:"fsync_seconds"`
	WriteStallSeconds float64 `json:"write_stall_seconds"`
}

// CPUPercent is the server's CPU use in the interval, 100 per core.
func (s GrowSample) CPUPercent() float64 {
	if s.IntervalSeconds <= 0 {
		return 0
	}
	return 100 * s.CPUSeconds / s.IntervalSeconds
}

// WriteGrowJSON writes rep to path atomically.
func WriteGrowJSON(rep *GrowReport, path string) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode grow report: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write grow report %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename grow report to %s: %w", path, err)
	}
	return nil
}

// ReadGrowJSON reads a report written by WriteGrowJSON.
func ReadGrowJSON(path string) (*GrowReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read grow report: %w", err)
	}
	var rep GrowReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("decode grow report %s: %w", path, err)
	}
	return &rep, nil
}

// RenderGrow writes results.md and the growth plots into dir and returns
// the files written.
func RenderGrow(rep *GrowReport, dir string) ([]string, error) {
	md := filepath.Join(dir, "results.md")
	if err := os.WriteFile(md, []byte(GrowMarkdown(rep)), 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", md, err)
	}
	pngs, err := PlotGrow(rep, dir)
	return append([]string{md}, pngs...), err
}

// growTableRows bounds the per-server sample table; results.json has every
// sample.
const growTableRows = 40

// sizeUnit picks MiB or GiB for sizes up to max bytes.
func sizeUnit(max int64) (string, float64) {
	if max >= 4<<30 {
		return "GiB", 1 << 30
	}
	return "MiB", 1 << 20
}

// GrowMarkdown renders a growth run.
func GrowMarkdown(rep *GrowReport) string {
	var b strings.Builder
	st := rep.Settings
	b.WriteString("# strata vs etcd: writes as the data grows\n\n")
	fmt.Fprintf(&b, "- started: %s\n", rep.Started.UTC().Format("2006-01-02 15:04:05 UTC"))
	fmt.Fprintf(&b, "- command: `%s`\n", rep.Command)
	m := rep.Machine
	fmt.Fprintf(&b, "- machine: %d CPUs, %s; memory %s; kernel %s; disk %s; %s\n", m.NProc, m.CPUModel, m.Memory, m.Kernel, m.Disk, m.GoVersion)
	fmt.Fprintf(&b, "- load average (1, 5, 15 min) at start: %s; at end: %s\n", m.LoadStart, m.LoadEnd)
	for _, s := range rep.Servers {
		fmt.Fprintf(&b, "- server `%s`: %s\n", s.Name, s.Version)
	}
	for _, r := range rep.Runs {
		if len(r.Command) > 0 {
			fmt.Fprintf(&b, "- `%s` command: `%s`\n", r.Server, strings.Join(r.Command, " "))
		}
	}
	target := fmt.Sprintf("its data directory reaches %s (du)", humanSize(st.TargetBytes))
	if st.TargetKeys > 0 {
		target += fmt.Sprintf(" or %d keys are written, whichever comes first", st.TargetKeys)
	}
	fmt.Fprintf(&b, "- writes: %d writers over %d connections put new keys (%d-byte YCSB-style names in hashed order, "+
		"random incompressible %d-byte values) until %s; sampled every %gs\n",
		st.Clients, st.Conns, st.KeySize, st.ValueSize, target, st.IntervalSeconds)
	fmt.Fprintf(&b, "- servers run one after the other, each on a fresh single member; both get "+
		"--quota-backend-bytes=%d (%s), above the target, so neither raises NOSPACE (etcd's default quota is 2 GiB, and it "+
		"warns above 8 GiB, its suggested maximum)\n",
		st.QuotaBackendBytes, humanSize(st.QuotaBackendBytes))
	b.WriteString("- a fresh member's data directory is not empty (disk at start below): etcd preallocates 64 MiB WAL " +
		"segments, strata its log segments; a target below that stops at the first check\n")
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "- note: %s\n", n)
	}
	b.WriteString("\nwrites/s, p50 and p99 are per interval (the writes that completed in it); disk is du of the data " +
		"(and strata's log) directories, preallocated segments counted in full; RSS is the server's resident set at the " +
		"end of the interval; CPU is its user+system time in the interval, 100% per core.\n")

	b.WriteString("\n## Summary\n\n")
	b.WriteString("| server | stop | keys | errors | seconds | writes/s | p50 ms | p99 ms | max ms | disk at start MiB | disk MiB | files MiB | disk bytes/key | first tenth writes/s | last tenth writes/s | last/first | max interval p99 ms | max RSS MiB |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Runs {
		var first, last, ratio, maxP99 float64
		var maxRSS int64
		if tenths := GrowTenths(r.Samples, st.IntervalSeconds); len(tenths) > 0 {
			first, last = tenths[0].Throughput, tenths[len(tenths)-1].Throughput
			if first > 0 {
				ratio = last / first
			}
		}
		for _, s := range r.Samples {
			maxP99 = math.Max(maxP99, s.P99)
			maxRSS = max(maxRSS, s.RSSBytes)
		}
		tput, perKey := 0.0, 0.0
		if r.Seconds > 0 {
			tput = float64(r.Keys) / r.Seconds
		}
		if r.Keys > 0 {
			perKey = float64(r.DataDirBytes) / float64(r.Keys)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.1f | %.0f | %.2f | %.2f | %.1f | %.1f | %.1f | %.1f | %.0f | %.0f | %.0f | %.2f | %.2f | %.0f |\n",
			r.Server, r.Stop, r.Keys, r.Errors, r.Seconds, tput, r.Latency.P50, r.Latency.P99, r.Latency.Max,
			float64(r.InitialDataDirBytes)/mib, float64(r.DataDirBytes)/mib, float64(r.DataDirApparentBytes)/mib, perKey,
			first, last, ratio, maxP99, float64(maxRSS)/mib)
	}
	b.WriteString("\nA tenth is a tenth of the run's full-length intervals, in time order; its writes/s and p99 are the " +
		"medians of its intervals. Per tenth, writes/s / p99 ms (keys at its end):\n\n")
	for _, r := range rep.Runs {
		fmt.Fprintf(&b, "- %s:", r.Server)
		for _, t := range GrowTenths(r.Samples, st.IntervalSeconds) {
			fmt.Fprintf(&b, " %.0f / %.1f (%d);", t.Throughput, t.P99, t.Keys)
		}
		b.WriteString("\n")
	}
	for _, r := range rep.Runs {
		if r.Err != "" {
			fmt.Fprintf(&b, "\n%s: %s\n", r.Server, r.Err)
		}
	}

	for _, r := range rep.Runs {
		fmt.Fprintf(&b, "\n## %s\n\n", r.Server)
		step := max(1, (len(r.Samples)+growTableRows-1)/growTableRows)
		if step > 1 {
			fmt.Fprintf(&b, "Every %dth sample of %d, and the last; results.json has them all.\n\n", step, len(r.Samples))
		}
		writeGrowSamples(&b, r.Samples, step, len(r.Samples)-1)
		slowest := slowestSamples(r.Samples, growSlowestRows)
		if len(slowest) > 0 {
			fmt.Fprintf(&b, "\nThe %d intervals with the slowest writes (max ms), and where they waited: fsyncs over 128 ms, "+
				"time in fsync, and Pebble's write stalls.\n\n", len(slowest))
			writeGrowSamples(&b, slowest, 1, -1)
		}
	}
	return b.String()
}

// growSlowestRows is how many of a run's slowest intervals GrowMarkdown lists.
const growSlowestRows = 5

// writeGrowSamples writes a table of every step-th sample and the one at
// index last.
func writeGrowSamples(b *strings.Builder, samples []GrowSample, step, last int) {
	b.WriteString("| t s | keys | disk MiB | files MiB | writes/s | p50 ms | p99 ms | max ms | errors | RSS MiB | CPU % | load1 | fsyncs > 128 ms | fsync s | stall s |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, s := range samples {
		if i%step != 0 && i != last {
			continue
		}
		fmt.Fprintf(b, "| %.0f | %d | %.1f | %.1f | %.0f | %.2f | %.2f | %.1f | %d | %.0f | %.0f | %.2f | %.0f | %.2f | %.2f |\n",
			s.Seconds, s.Keys, float64(s.DataDirBytes)/mib, float64(s.DataDirApparentBytes)/mib, s.Throughput,
			s.P50, s.P99, s.Max, s.Errors, float64(s.RSSBytes)/mib, s.CPUPercent(), s.Load1,
			s.SlowFsyncs, s.FsyncSeconds, s.WriteStallSeconds)
	}
}

// slowestSamples returns the n samples with the largest Max, slowest first.
func slowestSamples(samples []GrowSample, n int) []GrowSample {
	out := slices.Clone(samples)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Max > out[j].Max })
	return out[:min(n, len(out))]
}

// GrowTenth is one tenth of a growth run's full-length intervals, by time.
type GrowTenth struct {
	// Keys is the key count at the end of the tenth's last interval.
	Keys int64
	// Throughput and P99 are the medians of the tenth's intervals.
	Throughput, P99 float64
}

// GrowTenths splits the samples whose interval lasted at least 90% of
// interval seconds (the last, shorter one is left out) into ten groups of
// consecutive samples, as equal as the count allows, and gives each
// group's medians: the run's flatness, without letting one interval
// decide it (the first is a burst into empty memtables and caches). With
// fewer than ten such samples, each is its own group.
func GrowTenths(samples []GrowSample, interval float64) []GrowTenth {
	var full []GrowSample
	for _, s := range samples {
		if s.IntervalSeconds >= 0.9*interval {
			full = append(full, s)
		}
	}
	groups := min(10, len(full))
	out := make([]GrowTenth, 0, groups)
	for g := range groups {
		part := full[g*len(full)/groups : (g+1)*len(full)/groups]
		tput := make([]float64, len(part))
		p99 := make([]float64, len(part))
		for i, s := range part {
			tput[i], p99[i] = s.Throughput, s.P99
		}
		out = append(out, GrowTenth{Keys: part[len(part)-1].Keys, Throughput: median(tput), P99: median(p99)})
	}
	return out
}

// median of xs (not empty); xs is reordered.
func median(xs []float64) float64 {
	sort.Float64s(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// PlotGrow draws throughput and p99 latency per interval, one line per
// server, against the data directory's size and against time:
// grow-tput-size.png, grow-p99-size.png, grow-tput-time.png,
// grow-p99-time.png.
func PlotGrow(rep *GrowReport, dir string) ([]string, error) {
	var maxSize int64
	for _, r := range rep.Runs {
		for _, s := range r.Samples {
			maxSize = max(maxSize, s.DataDirBytes)
		}
	}
	unit, div := sizeUnit(maxSize)
	xs := []struct {
		name, label string
		x           func(GrowSample) float64
	}{
		{"size", "data directory size (" + unit + ", du)", func(s GrowSample) float64 { return float64(s.DataDirBytes) / div }},
		{"time", "time since the first write (s)", func(s GrowSample) float64 { return s.Seconds }},
	}
	ys := []struct {
		name, title, label string
		y                  func(GrowSample) float64
		log                bool
	}{
		{"tput", "write throughput", "writes/s in the interval", func(s GrowSample) float64 { return s.Throughput }, false},
		{"p99", "p99 write latency", "p99 of the interval (ms, log scale)", func(s GrowSample) float64 { return s.P99 }, true},
	}
	var files []string
	for _, y := range ys {
		for _, x := range xs {
			p := plot.New()
			p.Title.Text = fmt.Sprintf("%s as the data grows (%d-byte values, %d clients)", y.title, rep.Settings.ValueSize, rep.Settings.Clients)
			p.X.Label.Text = x.label
			p.Y.Label.Text = y.label
			if y.log {
				p.Y.Scale = plot.LogScale{}
				p.Y.Tick.Marker = ticks125{}
			} else {
				p.Y.Min = 0
			}
			var lines []any
			for _, r := range rep.Runs {
				var xys plotter.XYs
				for _, s := range r.Samples {
					v := y.y(s)
					if s.Ops == 0 || (y.log && v <= 0) {
						continue
					}
					xys = append(xys, plotter.XY{X: x.x(s), Y: v})
				}
				if len(xys) > 0 {
					lines = append(lines, r.Server, xys)
				}
			}
			if len(lines) == 0 {
				continue
			}
			if err := plotutil.AddLines(p, lines...); err != nil {
				return files, fmt.Errorf("plot grow %s/%s: %w", y.name, x.name, err)
			}
			p.Legend.Top = true
			name := filepath.Join(dir, fmt.Sprintf("grow-%s-%s.png", y.name, x.name))
			if err := p.Save(plotWidth, plotHeight, name); err != nil {
				return files, fmt.Errorf("save %s: %w", name, err)
			}
			files = append(files, name)
		}
	}
	return files, nil
}

// humanSize formats n in MiB below 1 GiB, else in GiB.
func humanSize(n int64) string {
	if n < 1<<30 {
		return fmt.Sprintf("%.1f MiB", float64(n)/mib)
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}
