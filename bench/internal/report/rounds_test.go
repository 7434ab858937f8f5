package report

import (
	"math"
	"strings"
	"testing"
)

func TestSpreadOf(t *testing.T) {
	tests := []struct {
		name string
		in   []float64
		want Spread
		ok   bool
	}{
		{name: "empty", in: nil, ok: false},
		{name: "one", in: []float64{7}, want: Spread{Median: 7, Min: 7, Max: 7, N: 1}, ok: true},
		{name: "odd count, unsorted", in: []float64{300, 100, 200}, want: Spread{Median: 200, Min: 100, Max: 300, N: 3}, ok: true},
		{name: "even count: mean of the middle two", in: []float64{4, 1, 3, 2}, want: Spread{Median: 2.5, Min: 1, Max: 4, N: 4}, ok: true},
		{name: "outlier does not move the median", in: []float64{10, 11, 1000, 9, 10}, want: Spread{Median: 10, Min: 9, Max: 1000, N: 5}, ok: true},
		{name: "ties", in: []float64{5, 5}, want: Spread{Median: 5, Min: 5, Max: 5, N: 2}, ok: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append([]float64(nil), tt.in...)
			got, ok := spreadOf(tt.in)
			if ok != tt.ok || got != tt.want {
				t.Errorf("spreadOf(%v) = %+v, %v; want %+v, %v", tt.in, got, ok, tt.want, tt.ok)
			}
			for i := range in {
				if in[i] != tt.in[i] {
					t.Fatalf("spreadOf reordered its input: %v, was %v", tt.in, in)
				}
			}
		})
	}
}

// rounds makes one server's results of a put configuration, one per
// round, with the given throughputs and p99s (a zero p99 stays zero).
func rounds(server string, tput, p99 []float64) []Result {
	var rs []Result
	for i := range tput {
		rs = append(rs, Result{Server: server, Workload: "put", Phase: "run", Conns: 1, Clients: 1, Round: i + 1,
			Throughput: tput[i], Latency: Latency{P99: p99[i]}})
	}
	return rs
}

func TestRatioSpread(t *testing.T) {
	ops := runColumns[0]
	p99 := runColumns[3]
	if ops.head != "ops/s" || p99.head != "p99 ms" {
		t.Fatalf("columns moved: %q, %q", ops.head, p99.head)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	tests := []struct {
		name        string
		base, other []Result
		col         column
		want        RatioSpread
		ok          bool
	}{
		{
			name:  "medians and per-round ratios",
			base:  rounds("etcd", []float64{100, 200, 400}, []float64{1, 1, 1}),
			other: rounds("strata", []float64{300, 200, 800}, []float64{1, 1, 1}),
			col:   ops,
			// medians 300/200; rounds 3, 1, 2.
			want: RatioSpread{OfMedians: 1.5, Min: 1, Max: 3, Rounds: 3}, ok: true,
		},
		{
			name:  "ratio of medians is not the median of ratios",
			base:  rounds("etcd", []float64{1, 10, 100}, []float64{1, 1, 1}),
			other: rounds("strata", []float64{100, 10, 1}, []float64{1, 1, 1}),
			col:   ops,
			want:  RatioSpread{OfMedians: 1, Min: 0.01, Max: 100, Rounds: 3}, ok: true,
		},
		{
			name:  "a round missing on one side is left out of the per-round ratios",
			base:  rounds("etcd", []float64{100, 100}, []float64{2, 4}),
			other: rounds("strata", []float64{100, 100, 100}, []float64{1, 1, 8})[1:], // rounds 2 and 3
			col:   p99,
			// medians 4.5/3; only round 2 pairs: 1/4.
			want: RatioSpread{OfMedians: 1.5, Min: 0.25, Max: 0.25, Rounds: 1}, ok: true,
		},
		{
			name:  "a zero baseline round is skipped",
			base:  rounds("etcd", []float64{0, 100, 200}, []float64{1, 1, 1}),
			other: rounds("strata", []float64{50, 150, 200}, []float64{1, 1, 1}),
			col:   ops,
			want:  RatioSpread{OfMedians: 1.5, Min: 1, Max: 1.5, Rounds: 2}, ok: true,
		},
		{
			name:  "zero baseline median",
			base:  rounds("etcd", []float64{0, 0, 5}, []float64{1, 1, 1}),
			other: rounds("strata", []float64{1, 2, 3}, []float64{1, 1, 1}),
			col:   ops,
			ok:    false,
		},
		{
			name:  "no baseline",
			base:  nil,
			other: rounds("strata", []float64{1}, []float64{1}),
			col:   ops,
			ok:    false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ratioSpread(tt.base, tt.other, tt.col)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v (%+v)", ok, tt.ok, got)
			}
			if !ok {
				return
			}
			if !near(got.OfMedians, tt.want.OfMedians) || !near(got.Min, tt.want.Min) || !near(got.Max, tt.want.Max) || got.Rounds != tt.want.Rounds {
				t.Errorf("ratioSpread = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestMarkdownRounds(t *testing.T) {
	rep := sampleReport()
	// Three interleaved rounds of one configuration replace the put rows.
	rep.Results = append(rounds("etcd", []float64{100, 200, 400}, []float64{2, 4, 6}),
		rounds("strata", []float64{300, 200, 800}, []float64{1, 2, 9})...)
	for i := range rep.Results {
		rep.Results[i].Load1 = 0.5 + float64(i)
	}
	md := Markdown(rep)
	lines := strings.Split(md, "\n")
	find := func(prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		t.Fatalf("no line starting %q in:\n%s", prefix, md)
		return ""
	}
	// etcd: ops/s median 200 (100–400); p99 median 4 (2–6).
	if row := find("| put | 1/1 |  | etcd (3 rounds) | 0 |"); !strings.Contains(row, "| 200 (100–400) |") || !strings.Contains(row, "| 4.00 (2.00–6.00) |") {
		t.Errorf("etcd row %q: want ops/s 200 (100–400) and p99 4.00 (2.00–6.00)", row)
	}
	if row := find("| put | 1/1 |  | strata (3 rounds) | 0 |"); !strings.Contains(row, "| 300 (200–800) |") {
		t.Errorf("strata row %q: want ops/s 300 (200–800)", row)
	}
	// ops/s: 300/200 = 1.50, rounds 3, 1, 2; p99: 2/4 = 0.50, rounds 0.5, 0.5, 1.5.
	row := find("| put | 1/1 |  | **strata/etcd** |")
	for _, want := range []string{"| 1.50× (1.00–3.00×) |", "| 0.50× (0.50–1.50×) |"} {
		if !strings.Contains(row, want) {
			t.Errorf("ratio row %q lacks %q", row, want)
		}
	}
	if !strings.Contains(md, "## Rounds") || !strings.Contains(md, "| put | 1/1 |  | 2 | strata | 4.50 | 0 | 200 |") {
		t.Errorf("markdown lacks the per-round table with round 2 of strata:\n%s", md)
	}
	// A run of one round renders as before: no Rounds section.
	if strings.Contains(Markdown(sampleReport()), "## Rounds") {
		t.Error("a run without rounds has a Rounds section")
	}
	// The plots render (CDFs per round, medians on the throughput curve).
	if _, err := Render(rep, t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

// TestMarkdownDefragRounds: Defragment measured in interleaved rounds is one
// row per server of medians, with the stall's spread, and a ratio row whose
// stall range comes from the per-round ratios.
func TestMarkdownDefragRounds(t *testing.T) {
	defrag := func(server string, round int, stallMs float64) Result {
		return Result{Server: server, Workload: "defrag", Phase: "defrag", Records: 100000, Conns: 1, Clients: 10,
			Round: round, Throughput: 1000, StallSeconds: stallMs / 1000, DataDirBytes: 64 * mib}
	}
	rep := &Report{Results: []Result{
		defrag("etcd", 1, 200), defrag("strata", 1, 10),
		defrag("strata", 2, 700), defrag("etcd", 2, 300),
		defrag("etcd", 3, 250), defrag("strata", 3, 50),
	}}
	md := Markdown(rep)
	for _, want := range []string{
		// etcd's stall: median 250 (200–300); strata's: 50 (10–700).
		"| 100000 | 10 | etcd (3 rounds) | 1000 (1000–1000) | 0.00 | 0.0 (0.0–0.0) | 250 (200–300) |",
		"| 100000 | 10 | strata (3 rounds) | 1000 (1000–1000) | 0.00 | 0.0 (0.0–0.0) | 50 (10–700) |",
		// Ratio of medians 50/250; per round 10/200, 700/300, 50/250.
		"| 100000 | 10 | **strata/etcd** | 1.00× (1.00–1.00×) | n/a | n/a | 0.20× (0.05–2.33×) |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("defrag table lacks %q:\n%s", want, md)
		}
	}
	// One round keeps the one-row-per-run table.
	one := &Report{Results: []Result{defrag("etcd", 0, 200), defrag("strata", 0, 10)}}
	if md := Markdown(one); !strings.Contains(md, "| 100000 | 10 | strata | 1000 | 0.00 | 0.0 | 10 |") {
		t.Errorf("one-round defrag table changed:\n%s", md)
	}
}

// TestMarkdownRestartRounds: restarts measured in interleaved rounds are one
// row per server of medians, with the restart's and the disk's spread, and
// a ratio row whose restart range comes from the per-round ratios.
func TestMarkdownRestartRounds(t *testing.T) {
	restart := func(server string, round int, seconds float64, diskMiB int64) Result {
		return Result{Server: server, Workload: "restart", Phase: "restart", Records: 1000000,
			Round: round, RestartSeconds: seconds, DataDirBytes: diskMiB * mib, DataDirApparentBytes: diskMiB * mib}
	}
	rep := &Report{Results: []Result{
		restart("etcd", 1, 5, 432), restart("strata", 1, 0.25, 130),
		restart("strata", 2, 0.8, 141), restart("etcd", 2, 4, 432),
		restart("etcd", 3, 6, 432), restart("strata", 3, 0.3, 130),
	}}
	md := Markdown(rep)
	for _, want := range []string{
		"| records | server | restart s | disk MiB | files MiB |",
		// etcd's restart: median 5 (4–6); strata's: 0.3 (0.25–0.8).
		"| 1000000 | etcd (3 rounds) | 5.000 (4.000–6.000) | 432.0 (432.0–432.0) | 432.0 |",
		"| 1000000 | strata (3 rounds) | 0.300 (0.250–0.800) | 130.0 (130.0–141.0) | 130.0 |",
		// Ratio of medians 0.3/5; per round 0.25/5, 0.8/4, 0.3/6.
		"| 1000000 | **strata/etcd** | 0.06× (0.05–0.20×) | 0.30× (0.30–0.33×) | 0.30× |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("restart table lacks %q:\n%s", want, md)
		}
	}
	// One round keeps the one-row-per-run table.
	one := &Report{Results: []Result{restart("etcd", 0, 5, 432), restart("strata", 0, 0.25, 130)}}
	if md := Markdown(one); !strings.Contains(md, "| 1000000 | strata | 0.250 | 130.0 | 130.0 | 0.05× | 0.30× |") {
		t.Errorf("one-round restart table changed:\n%s", md)
	}
}
