package report

import (
	"fmt"
	"slices"
	"strings"
)

// group is the results of one Key, baseline first.
type group struct {
	key     string
	results []Result
}

// groups splits results by Key, in order of first appearance, with the
// baseline server first in each group.
func groups(results []Result, phase string) []group {
	var out []group
	idx := map[string]int{}
	for _, r := range results {
		if r.Phase != phase {
			continue
		}
		k := r.Key()
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, group{key: k})
		}
		if r.Server == Baseline {
			out[i].results = append([]Result{r}, out[i].results...)
		} else {
			out[i].results = append(out[i].results, r)
		}
	}
	return out
}

// column is one numeric column of the run table.
type column struct {
	head string
	val  func(Result) (float64, bool) // false: not available
	fmt  string
}

const mib = 1 << 20

var runColumns = []column{
	{head: "ops/s", val: func(r Result) (float64, bool) { return r.Throughput, true }, fmt: "%.0f"},
	{head: "p50 ms", val: func(r Result) (float64, bool) { return r.Latency.P50, true }, fmt: "%.2f"},
	{head: "p90 ms", val: func(r Result) (float64, bool) { return r.Latency.P90, true }, fmt: "%.2f"},
	{head: "p99 ms", val: func(r Result) (float64, bool) { return r.Latency.P99, true }, fmt: "%.2f"},
	{head: "max ms", val: func(r Result) (float64, bool) { return r.Latency.Max, true }, fmt: "%.1f"},
	{head: "CPU s", val: func(r Result) (float64, bool) { return r.Usage.CPUSeconds, true }, fmt: "%.2f"},
	{head: "CPU µs/op", val: func(r Result) (float64, bool) {
		if r.Ops == 0 {
			return 0, false
		}
		return r.Usage.CPUSeconds * 1e6 / float64(r.Ops), true
	}, fmt: "%.0f"},
	{head: "peak RSS MiB", val: func(r Result) (float64, bool) { return float64(r.Usage.PeakRSSBytes) / mib, true }, fmt: "%.0f"},
	{head: "write_bytes MiB", val: func(r Result) (float64, bool) { return float64(r.Usage.WriteBytes) / mib, true }, fmt: "%.1f"},
	{head: "device MiB", val: func(r Result) (float64, bool) {
		if r.Usage.DeviceWriteBytes == nil {
			return 0, false
		}
		return float64(*r.Usage.DeviceWriteBytes) / mib, true
	}, fmt: "%.1f"},
	{head: "fsyncs", val: func(r Result) (float64, bool) {
		if r.Usage.Fsyncs == nil {
			return 0, false
		}
		return float64(*r.Usage.Fsyncs), true
	}, fmt: "%.0f"},
	{head: "disk MiB", val: func(r Result) (float64, bool) { return float64(r.DataDirBytes) / mib, true }, fmt: "%.1f"},
	{head: "files MiB", val: func(r Result) (float64, bool) { return float64(r.DataDirApparentBytes) / mib, true }, fmt: "%.1f"},
}

// Markdown renders rep as a Markdown document.
func Markdown(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# strata vs etcd: benchmark results\n\n")
	fmt.Fprintf(&b, "- started: %s\n", rep.Started.UTC().Format("2006-01-02 15:04:05 UTC"))
	fmt.Fprintf(&b, "- command: `%s`\n", rep.Command)
	m := rep.Machine
	fmt.Fprintf(&b, "- machine: %d CPUs, %s; memory %s; kernel %s; disk %s; %s\n", m.NProc, m.CPUModel, m.Memory, m.Kernel, m.Disk, m.GoVersion)
	fmt.Fprintf(&b, "- load average (1, 5, 15 min) at start: %s; at end: %s\n", m.LoadStart, m.LoadEnd)
	for _, s := range rep.Servers {
		fmt.Fprintf(&b, "- server `%s`: %s\n", s.Name, s.Version)
		if len(s.Command) > 0 {
			fmt.Fprintf(&b, "  - command: `%s`\n", strings.Join(s.Command, " "))
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(&b, "- note: %s\n", n)
	}
	b.WriteString("\nRatios are strata/etcd for every column: above 1 means strata's number is larger " +
		"(better for ops/s, worse for latency, CPU, memory and bytes). " +
		"disk MiB is what the data and log directories occupy (du: preallocated segments count in full); " +
		"files MiB is the sum of the file lengths. " +
		"write_bytes MiB is the servers' /proc/PID/io write_bytes: the page-cache folios they dirtied, which on kernels " +
		"with large folios counts a whole folio (up to megabytes) for a small write into it, so it overstates small appends " +
		"into files that were written in large chunks (strata's zero-filled log segments); " +
		"device MiB is what the block device under the data directories wrote during the run (sectors written, after a syncfs " +
		"at both ends, file-system journal included), which also counts other processes writing to that device.\n")
	if fs := fsyncSources(rep); len(fs) > 0 {
		b.WriteString("\nfsync counts: " + strings.Join(fs, "; ") + ".\n")
	}

	if gs := groups(rep.Results, "run"); len(gs) > 0 {
		b.WriteString("\n## Workloads\n\n")
		if slices.ContainsFunc(gs, hasRounds) {
			b.WriteString("Interleaved rounds (-rounds): a server's row is the median over its rounds, with (min–max) over the " +
				"rounds for ops/s, p50 and p99; the ratio row divides the medians, and for ops/s, p50 and p99 gives " +
				"(min–max) of the per-round ratios (round k's server over round k's etcd); errors are summed over the rounds. " +
				"Each round is listed under Rounds.\n\n")
		}
		writeTableHead(&b, []string{"workload", "conns/clients", "records", "server", "errors"}, runColumns)
		for _, g := range gs {
			if hasRounds(g) {
				writeRoundsGroup(&b, g)
			} else {
				writeGroup(&b, g)
			}
		}
		writeRoundsDetail(&b, rep.Results)
	}
	if gs := groups(rep.Results, "restart"); len(gs) > 0 {
		b.WriteString("\n## Restart after kill -9\n\n")
		b.WriteString("Time from exec to the first successful linearizable read.\n\n")
		if slices.ContainsFunc(gs, hasRounds) {
			writeRestartRounds(&b, gs)
		} else {
			writeRestartRuns(&b, gs)
		}
	}
	if gs := groups(rep.Results, "defrag"); len(gs) > 0 {
		b.WriteString("\n## Writes during Defragment\n\n")
		b.WriteString("N keys loaded twice and compacted to the last revision, then writers put new keys while " +
			"Defragment runs on every member (from 1 s into the window). stall: the longest interval without a " +
			"completed write; defrag s: how long the Defragment calls took to return (strata's returns at once and " +
			"compacts in the background). disk MiB before: after the load and the revision compaction; after: at the end of the window.\n\n")
		if slices.ContainsFunc(gs, hasRounds) {
			writeDefragRounds(&b, gs)
		} else {
			writeDefragRuns(&b, gs)
		}
	}
	return b.String()
}

// writeRestartRuns writes the restart table of a run of one round.
func writeRestartRuns(b *strings.Builder, gs []group) {
	b.WriteString("| records | server | restart s | disk MiB | files MiB | ratio restart | ratio disk |\n|---|---|---|---|---|---|---|\n")
	for _, g := range gs {
		base, hasBase := baseline(g)
		for _, r := range g.results {
			rr, rd := "", ""
			if hasBase && r.Server != Baseline {
				rr = ratio(r.RestartSeconds, base.RestartSeconds)
				rd = ratio(float64(r.DataDirBytes), float64(base.DataDirBytes))
			}
			fmt.Fprintf(b, "| %d | %s | %.3f | %.1f | %.1f | %s | %s |\n", r.Records, r.Server, r.RestartSeconds,
				float64(r.DataDirBytes)/mib, float64(r.DataDirApparentBytes)/mib, rr, rd)
		}
	}
}

// restartColumns are the restart table's measured columns.
var restartColumns = []column{
	{head: "restart s", val: func(r Result) (float64, bool) { return r.RestartSeconds, true }, fmt: "%.3f"},
	{head: "disk MiB", val: func(r Result) (float64, bool) { return float64(r.DataDirBytes) / mib, true }, fmt: "%.1f"},
	{head: "files MiB", val: func(r Result) (float64, bool) { return float64(r.DataDirApparentBytes) / mib, true }, fmt: "%.1f"},
}

// restartSpread are the restart columns shown with their spread: a
// restart's time depends on where the kill falls in the engine's flush
// cycle, and so does the disk left behind (unflushed log segments).
var restartSpread = map[string]bool{"restart s": true, "disk MiB": true}

// writeRestartRounds writes the restart table of an interleaved run: per
// server the medians over the rounds, and the ratios to the baseline.
func writeRestartRounds(b *strings.Builder, gs []group) {
	writeStepRounds(b, gs, "Interleaved rounds (-rounds): a server's row is the median over its rounds, with (min–max) for "+
		"the restart and the disk; the ratio row divides the medians and gives (min–max) of the per-round ratios.\n\n",
		[]string{"records"}, func(r Result) string { return fmt.Sprintf("%d", r.Records) }, restartColumns, restartSpread)
}

// writeStepRounds writes the table of a step measured in interleaved
// rounds: intro, then for each group one row per server of medians and one
// ratio row per non-baseline server (writeRoundsRows), each led by the
// cells lead gives for the group's first result, under leadHeads.
func writeStepRounds(b *strings.Builder, gs []group, intro string, leadHeads []string, lead func(Result) string,
	cols []column, spread map[string]bool) {
	b.WriteString(intro)
	writeTableHead(b, append(slices.Clone(leadHeads), "server"), cols)
	for _, g := range gs {
		cells := lead(g.results[0])
		writeRoundsRows(b, g, cols, spread, func(name string, rs []Result) string {
			return fmt.Sprintf("| %s | %s (%d rounds) |", cells, name, len(rs))
		}, func(name string) string {
			return fmt.Sprintf("| %s | **%s/%s** |", cells, name, Baseline)
		})
	}
}

// writeDefragRuns writes the Defragment table of a run of one round.
func writeDefragRuns(b *strings.Builder, gs []group) {
	b.WriteString("| records | clients | server | writes/s | p99 ms | max ms | stall ms | defrag s | disk MiB before | disk MiB after | ratio stall | ratio disk after |\n" +
		"|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, g := range gs {
		base, hasBase := baseline(g)
		for _, r := range g.results {
			rs, rd := "", ""
			if hasBase && r.Server != Baseline {
				rs = ratio(r.StallSeconds, base.StallSeconds)
				rd = ratio(float64(r.DataDirBytes), float64(base.DataDirBytes))
			}
			fmt.Fprintf(b, "| %d | %d | %s | %.0f | %.2f | %.1f | %.0f | %.3f | %.1f | %.1f | %s | %s |\n", r.Records, r.Clients, r.Server,
				r.Throughput, r.Latency.P99, r.Latency.Max, r.StallSeconds*1000, r.DefragSeconds,
				float64(r.DataDirBytesBefore)/mib, float64(r.DataDirBytes)/mib, rs, rd)
		}
	}
}

// writeTableHead writes a table's header row and separator: the lead
// cells, then one per column.
func writeTableHead(b *strings.Builder, lead []string, cols []column) {
	heads := slices.Clone(lead)
	for _, c := range cols {
		heads = append(heads, c.head)
	}
	b.WriteString("| " + strings.Join(heads, " | ") + " |\n|" + strings.Repeat("---|", len(heads)) + "\n")
}

// defragColumns are the Defragment table's measured columns.
var defragColumns = []column{
	{head: "writes/s", val: func(r Result) (float64, bool) { return r.Throughput, true }, fmt: "%.0f"},
	{head: "p99 ms", val: func(r Result) (float64, bool) { return r.Latency.P99, true }, fmt: "%.2f"},
	{head: "max ms", val: func(r Result) (float64, bool) { return r.Latency.Max, true }, fmt: "%.1f"},
	{head: "stall ms", val: func(r Result) (float64, bool) { return r.StallSeconds * 1000, true }, fmt: "%.0f"},
	{head: "defrag s", val: func(r Result) (float64, bool) { return r.DefragSeconds, true }, fmt: "%.3f"},
	{head: "disk MiB before", val: func(r Result) (float64, bool) { return float64(r.DataDirBytesBefore) / mib, true }, fmt: "%.1f"},
	{head: "disk MiB after", val: func(r Result) (float64, bool) { return float64(r.DataDirBytes) / mib, true }, fmt: "%.1f"},
}

// defragSpread are the Defragment columns shown with their spread: the
// stall varies between runs of one build by more than builds differ
// (docs/bench/tail-20261129/), so one run of it says little.
var defragSpread = map[string]bool{"writes/s": true, "max ms": true, "stall ms": true}

// writeDefragRounds writes the Defragment table of an interleaved run: per
// server the medians over the rounds, and the ratios to the baseline.
func writeDefragRounds(b *strings.Builder, gs []group) {
	writeStepRounds(b, gs, "Interleaved rounds (-rounds): a server's row is the median over its rounds, with (min–max) for "+
		"writes/s, max and stall; the ratio row divides the medians and gives (min–max) of the per-round ratios.\n\n",
		[]string{"records", "clients"}, func(r Result) string { return fmt.Sprintf("%d | %d", r.Records, r.Clients) },
		defragColumns, defragSpread)
}

// fsyncSources lists, per server, where its fsync count comes from.
func fsyncSources(rep *Report) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range rep.Results {
		if seen[r.Server] || r.Usage.FsyncSource == "" {
			continue
		}
		seen[r.Server] = true
		out = append(out, fmt.Sprintf("%s: %s", r.Server, r.Usage.FsyncSource))
	}
	return out
}

// baseline returns the group's baseline result, if it has one.
func baseline(g group) (Result, bool) {
	if len(g.results) > 0 && g.results[0].Server == Baseline {
		return g.results[0], true
	}
	return Result{}, false
}

// writeGroup writes one row per server and one ratio row per non-baseline
// server.
func writeGroup(b *strings.Builder, g group) {
	base, hasBase := baseline(g)
	for _, r := range g.results {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %d |", r.Workload, connsClients(r), records(r), r.Server, r.Errors)
		for _, c := range runColumns {
			v, ok := c.val(r)
			if !ok {
				b.WriteString(" n/a |")
				continue
			}
			fmt.Fprintf(b, " "+c.fmt+" |", v)
		}
		b.WriteString("\n")
	}
	if !hasBase {
		return
	}
	for _, r := range g.results[1:] {
		fmt.Fprintf(b, "| %s | %s | %s | **%s/%s** | |", r.Workload, connsClients(r), records(r), r.Server, Baseline)
		for _, c := range runColumns {
			v, ok1 := c.val(r)
			w, ok2 := c.val(base)
			if !ok1 || !ok2 {
				b.WriteString(" n/a |")
				continue
			}
			b.WriteString(" " + ratio(v, w) + " |")
		}
		b.WriteString("\n")
	}
}

// ratio formats a/b, or "–" when b is zero.
func ratio(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func connsClients(r Result) string {
	if r.Conns == 0 {
		return ""
	}
	return fmt.Sprintf("%d/%d", r.Conns, r.Clients)
}

func records(r Result) string {
	if r.Records == 0 {
		return ""
	}
	return fmt.Sprintf("%d", r.Records)
}
