package report

import (
	"fmt"
	"slices"
	"strings"
)

// Interleaved rounds (-rounds N): every server measured once per round, in
// alternating order, so a slow drift of the machine (other tenants, page
// cache, thermal state) falls on both servers alike. A group's table row is
// then the median over the rounds, with the spread (min–max) of the columns
// that decide a comparison, and its ratio row divides the medians and gives
// the range of the per-round ratios (round k's server over round k's
// baseline).

// Spread summarises one column over the rounds.
type Spread struct {
	Median, Min, Max float64
	// N is the number of rounds that had a value.
	N int
}

// spreadOf returns the median, minimum and maximum of vs; false if vs is
// empty. The median of an even count is the mean of the two middle values.
func spreadOf(vs []float64) (Spread, bool) {
	if len(vs) == 0 {
		return Spread{}, false
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	m := s[n/2]
	if n%2 == 0 {
		m = (s[n/2-1] + s[n/2]) / 2
	}
	return Spread{Median: m, Min: s[0], Max: s[n-1], N: n}, true
}

// columnSpread is the Spread of column c over rs (one server's rounds);
// results without a value are left out.
func columnSpread(rs []Result, c column) (Spread, bool) {
	var vs []float64
	for _, r := range rs {
		if v, ok := c.val(r); ok {
			vs = append(vs, v)
		}
	}
	return spreadOf(vs)
}

// RatioSpread compares one column of two servers over the rounds.
type RatioSpread struct {
	// OfMedians is the other server's median over the baseline's median.
	OfMedians float64
	// Min and Max bound the per-round ratios: round k's value of the other
	// server over round k's value of the baseline, for the rounds where
	// both have a value and the baseline's is not zero.
	Min, Max float64
	// Rounds is the number of per-round ratios; 0 leaves Min and Max
	// unset.
	Rounds int
}

// ratioSpread compares column c of other against base (each one server's
// results over the rounds); false when a median is missing or the
// baseline's is zero.
func ratioSpread(base, other []Result, c column) (RatioSpread, bool) {
	bs, ok1 := columnSpread(base, c)
	ot, ok2 := columnSpread(other, c)
	if !ok1 || !ok2 || bs.Median == 0 {
		return RatioSpread{}, false
	}
	rs := RatioSpread{OfMedians: ot.Median / bs.Median}
	byRound := map[int]float64{}
	for _, r := range base {
		if v, ok := c.val(r); ok && v != 0 {
			byRound[r.Round] = v
		}
	}
	for _, r := range other {
		v, ok := c.val(r)
		b, okb := byRound[r.Round]
		if !ok || !okb {
			continue
		}
		x := v / b
		if rs.Rounds == 0 || x < rs.Min {
			rs.Min = x
		}
		if rs.Rounds == 0 || x > rs.Max {
			rs.Max = x
		}
		rs.Rounds++
	}
	return rs, true
}

// hasRounds reports whether any result of g comes from an interleaved run.
func hasRounds(g group) bool {
	return slices.ContainsFunc(g.results, func(r Result) bool { return r.Round > 0 })
}

// byServer splits a group's results by server, the baseline first and the
// others in order of first appearance, each in measurement order.
func byServer(rs []Result) (names []string, per map[string][]Result) {
	per = map[string][]Result{}
	for _, r := range rs {
		if _, ok := per[r.Server]; !ok {
			names = append(names, r.Server)
		}
		per[r.Server] = append(per[r.Server], r)
	}
	slices.SortStableFunc(names, func(a, b string) int {
		switch {
		case a == b:
			return 0
		case a == Baseline:
			return -1
		case b == Baseline:
			return 1
		}
		return 0
	})
	for _, n := range names {
		slices.SortStableFunc(per[n], func(a, b Result) int { return a.Round - b.Round })
	}
	return names, per
}

// spreadColumns are the columns shown with their spread over the rounds.
var spreadColumns = map[string]bool{"ops/s": true, "p50 ms": true, "p99 ms": true}

// writeRoundsGroup writes one row per server (medians over the rounds,
// with the spread of spreadColumns) and one ratio row per non-baseline
// server.
func writeRoundsGroup(b *strings.Builder, g group) {
	first := g.results[0]
	writeRoundsRows(b, g, runColumns, spreadColumns, func(name string, rs []Result) string {
		var errs int64
		for _, r := range rs {
			errs += r.Errors
		}
		return fmt.Sprintf("| %s | %s | %s | %s (%d rounds) | %d |", first.Workload, connsClients(first), records(first), name, len(rs), errs)
	}, func(name string) string {
		return fmt.Sprintf("| %s | %s | %s | **%s/%s** | |", first.Workload, connsClients(first), records(first), name, Baseline)
	})
}

// writeRoundsRows writes, for the group's interleaved rounds, one row per
// server (lead's cells, then the median of each of cols, with the spread
// of those in spread) and one ratio row per non-baseline server (ratioLead's
// cells, then the ratio of the medians, with the range of the per-round
// ratios for those in spread).
func writeRoundsRows(b *strings.Builder, g group, cols []column, spread map[string]bool,
	lead func(server string, rounds []Result) string, ratioLead func(server string) string) {
	names, per := byServer(g.results)
	for _, name := range names {
		rs := per[name]
		b.WriteString(lead(name, rs))
		for _, c := range cols {
			s, ok := columnSpread(rs, c)
			switch {
			case !ok:
				b.WriteString(" n/a |")
			case spread[c.head]:
				fmt.Fprintf(b, " "+c.fmt+" ("+c.fmt+"–"+c.fmt+") |", s.Median, s.Min, s.Max)
			default:
				fmt.Fprintf(b, " "+c.fmt+" |", s.Median)
			}
		}
		b.WriteString("\n")
	}
	base, ok := per[Baseline]
	if !ok {
		return
	}
	for _, name := range names {
		if name == Baseline {
			continue
		}
		b.WriteString(ratioLead(name))
		for _, c := range cols {
			rs, ok := ratioSpread(base, per[name], c)
			switch {
			case !ok:
				b.WriteString(" n/a |")
			case spread[c.head] && rs.Rounds > 0:
				fmt.Fprintf(b, " %.2f× (%.2f–%.2f×) |", rs.OfMedians, rs.Min, rs.Max)
			default:
				fmt.Fprintf(b, " %.2f× |", rs.OfMedians)
			}
		}
		b.WriteString("\n")
	}
}

// writeRoundsDetail lists every round of the interleaved groups in the
// order measured, with the load average at each measurement's start.
func writeRoundsDetail(b *strings.Builder, results []Result) {
	var rows []Result
	for _, r := range results {
		if r.Phase == "run" && r.Round > 0 {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("\n## Rounds\n\n")
	b.WriteString("Every round of the table above, in the order measured (servers alternate: round 1 in the order of " +
		"-servers, round 2 reversed, and so on); load1 is the machine's 1-minute load average when the measurement started.\n\n")
	b.WriteString("| workload | conns/clients | records | round | server | load1 | errors | ops/s | p50 ms | p99 ms |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(b, "| %s | %s | %s | %d | %s | %.2f | %d | %.0f | %.2f | %.2f |\n", r.Workload, connsClients(r), records(r),
			r.Round, r.Server, r.Load1, r.Errors, r.Throughput, r.Latency.P50, r.Latency.P99)
	}
}
