package report

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Plot size in inches.
const (
	plotWidth  = 7 * vg.Inch
	plotHeight = 4.5 * vg.Inch
)

// Plot writes the PNG plots of rep into dir and returns their paths:
//   - cdf-<group>.png: latency by percentile (an HDR histogram plot) for each
//     workload configuration, one line per server;
//   - tput-lat-<workload>.png: throughput against p50 and p99 latency over
//     the client counts measured for one workload (the saturation sweep, the
//     put configurations), one line per server and percentile; with
//     interleaved rounds, each point is the median over the rounds.
func Plot(rep *Report, dir string) ([]string, error) {
	var files []string
	for _, g := range groups(rep.Results, "run") {
		f, err := plotCDF(g, dir)
		if err != nil {
			return files, err
		}
		if f != "" {
			files = append(files, f)
		}
	}
	fs, err := plotThroughputLatency(rep.Results, dir)
	return append(files, fs...), err
}

// title returns a human title for a group.
func title(r Result) string {
	t := r.Workload
	if r.Conns > 0 {
		t += fmt.Sprintf(" conns/clients %d/%d", r.Conns, r.Clients)
	}
	if r.Records > 0 {
		t += fmt.Sprintf(" records %d", r.Records)
	}
	return t
}

// slug makes s safe as part of a file name.
func slug(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '-'
	}, s)
}

// plotCDF draws one group's latency distributions as an HDR percentile plot
// (latency against percentile, the percentile axis stretched towards the
// tail); it returns "" when no server has latency points.
func plotCDF(g group, dir string) (string, error) {
	p := plot.New()
	first := g.results[0]
	p.Title.Text = "latency by percentile: " + title(first)
	p.X.Label.Text = "percentile"
	p.Y.Label.Text = "latency (ms, log scale)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = tailTicks{}
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = ticks125{}
	rs := g.results
	if hasRounds(g) {
		// Per server, its rounds in order, the baseline first.
		names, per := byServer(rs)
		rs = nil
		for _, n := range names {
			rs = append(rs, per[n]...)
		}
	}
	var lines []any
	for _, r := range rs {
		var xys plotter.XYs
		n := float64(r.Ops - r.Errors)
		for _, c := range r.CDF {
			if c.Millis <= 0 {
				continue
			}
			x := float64(1)
			switch {
			case c.Percentile >= 100:
				// The maximum: place it where one sample in n would sit.
				x = max(n, 1)
			default:
				x = tailX(c.Percentile)
			}
			xys = append(xys, plotter.XY{X: x, Y: c.Millis})
		}
		if len(xys) == 0 {
			continue
		}
		name := r.Server
		if r.Round > 0 {
			name += fmt.Sprintf(" r%d", r.Round)
		}
		lines = append(lines, name, xys)
	}
	if len(lines) == 0 {
		return "", nil
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return "", fmt.Errorf("plot cdf %s: %w", title(first), err)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	name := filepath.Join(dir, "cdf-"+slug(fmt.Sprintf("%s-%d-%d-%d", first.Workload, first.Conns, first.Clients, first.Records))+".png")
	if err := p.Save(plotWidth, plotHeight, name); err != nil {
		return "", fmt.Errorf("save %s: %w", name, err)
	}
	return name, nil
}

// plotThroughputLatency draws, for each workload and record count measured at
// more than one client count, throughput against latency.
func plotThroughputLatency(results []Result, dir string) ([]string, error) {
	type family struct {
		workload string
		records  int64
	}
	byFamily := map[family]map[string][]Result{} // family -> server -> results
	var order []family
	for _, r := range results {
		if r.Phase != "run" || r.Throughput <= 0 {
			continue
		}
		f := family{r.Workload, r.Records}
		if byFamily[f] == nil {
			byFamily[f] = map[string][]Result{}
			order = append(order, f)
		}
		byFamily[f][r.Server] = append(byFamily[f][r.Server], r)
	}
	var files []string
	for _, f := range order {
		servers := byFamily[f]
		multi := false
		for _, rs := range servers {
			if len(medianRounds(rs)) > 1 {
				multi = true
			}
		}
		if !multi {
			continue
		}
		p := plot.New()
		p.Title.Text = "throughput vs latency: " + f.workload
		if f.records > 0 {
			p.Title.Text += fmt.Sprintf(" records %d", f.records)
		}
		p.X.Label.Text = "throughput (ops/s)"
		p.Y.Label.Text = "latency (ms, log scale)"
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = ticks125{}
		names := make([]string, 0, len(servers))
		for s := range servers {
			names = append(names, s)
		}
		sort.Strings(names)
		var lines []any
		for _, s := range names {
			rs := medianRounds(servers[s])
			sort.Slice(rs, func(i, j int) bool { return rs[i].Clients < rs[j].Clients })
			var p50, p99 plotter.XYs
			for _, r := range rs {
				if r.Latency.P50 > 0 {
					p50 = append(p50, plotter.XY{X: r.Throughput, Y: r.Latency.P50})
				}
				if r.Latency.P99 > 0 {
					p99 = append(p99, plotter.XY{X: r.Throughput, Y: r.Latency.P99})
				}
			}
			if len(p50) > 0 {
				lines = append(lines, s+" p50", p50)
			}
			if len(p99) > 0 {
				lines = append(lines, s+" p99", p99)
			}
		}
		if len(lines) == 0 {
			continue
		}
		if err := plotutil.AddLinePoints(p, lines...); err != nil {
			return files, fmt.Errorf("plot throughput/latency %s: %w", f.workload, err)
		}
		p.Legend.Top = true
		p.Legend.Left = true
		name := filepath.Join(dir, "tput-lat-"+slug(fmt.Sprintf("%s-%d", f.workload, f.records))+".png")
		if err := p.Save(plotWidth, plotHeight, name); err != nil {
			return files, fmt.Errorf("save %s: %w", name, err)
		}
		files = append(files, name)
	}
	return files, nil
}

// medianRounds collapses one server's results of an interleaved run into one
// per conns/clients setting: throughput, p50 and p99 are the medians over
// the rounds. Results of a run without rounds are returned as they are.
func medianRounds(rs []Result) []Result {
	if !slices.ContainsFunc(rs, func(r Result) bool { return r.Round > 0 }) {
		return rs
	}
	type cc struct{ conns, clients int }
	var order []cc
	by := map[cc][]Result{}
	for _, r := range rs {
		k := cc{r.Conns, r.Clients}
		if by[k] == nil {
			order = append(order, k)
		}
		by[k] = append(by[k], r)
	}
	out := make([]Result, 0, len(order))
	for _, k := range order {
		m := by[k][0]
		m.Round = 0
		m.Throughput = medianOf(by[k], func(r Result) float64 { return r.Throughput })
		m.Latency.P50 = medianOf(by[k], func(r Result) float64 { return r.Latency.P50 })
		m.Latency.P99 = medianOf(by[k], func(r Result) float64 { return r.Latency.P99 })
		out = append(out, m)
	}
	return out
}

// medianOf is the median of f over rs (rs not empty).
func medianOf(rs []Result, f func(Result) float64) float64 {
	vs := make([]float64, len(rs))
	for i, r := range rs {
		vs[i] = f(r)
	}
	s, _ := spreadOf(vs)
	return s.Median
}
