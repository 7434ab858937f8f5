package report

import (
	"strings"
	"testing"
)

// samples makes one 10 s sample per rate, keys counting 1,000 per sample;
// a last shorter interval is appended when tail > 0.
func samples(rates []float64, tail float64) []GrowSample {
	var out []GrowSample
	for i, r := range rates {
		out = append(out, GrowSample{Seconds: float64(10 * (i + 1)), Keys: int64(1000 * (i + 1)), IntervalSeconds: 10, Throughput: r, P99: r / 100})
	}
	if tail > 0 {
		out = append(out, GrowSample{Seconds: float64(10*len(rates)) + 2, Keys: int64(1000*len(rates) + 1), IntervalSeconds: 2, Throughput: tail, P99: 1})
	}
	return out
}

func TestGrowTenths(t *testing.T) {
	flat := make([]float64, 40)
	for i := range flat {
		flat[i] = 1000
	}
	burst := append([]float64{5000}, flat[1:]...)
	decay := make([]float64, 20)
	for i := range decay {
		decay[i] = float64(2000 - 50*i)
	}
	for _, tc := range []struct {
		name        string
		samples     []GrowSample
		groups      int
		first, last float64
		lastKeys    int64
	}{
		// A burst in the first interval does not move the first tenth's
		// median: flatness is not decided by one interval.
		{"burst then flat", samples(burst, 0), 10, 1000, 1000, 40000},
		// The last, shorter interval is left out, however slow.
		{"short last interval", samples(flat, 3), 10, 1000, 1000, 40000},
		{"decay", samples(decay, 0), 10, 1975, 1075, 20000},
		{"fewer than ten", samples([]float64{300, 200, 100}, 0), 3, 300, 100, 3000},
		{"none", nil, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := GrowTenths(tc.samples, 10)
			if len(got) != tc.groups {
				t.Fatalf("%d groups, want %d: %+v", len(got), tc.groups, got)
			}
			if tc.groups == 0 {
				return
			}
			if got[0].Throughput != tc.first || got[len(got)-1].Throughput != tc.last || got[len(got)-1].Keys != tc.lastKeys {
				t.Fatalf("first %v, last %v (keys %d); want %v, %v (keys %d)", got[0].Throughput, got[len(got)-1].Throughput,
					got[len(got)-1].Keys, tc.first, tc.last, tc.lastKeys)
			}
		})
	}
}

func TestGrowMarkdownFlatness(t *testing.T) {
	decay := make([]float64, 20)
	for i := range decay {
		decay[i] = float64(2000 - 50*i)
	}
	rep := &GrowReport{Settings: GrowSettings{IntervalSeconds: 10}, Runs: []GrowRun{{Server: "strata", Keys: 20000, Seconds: 200, Samples: samples(decay, 0)}}}
	md := GrowMarkdown(rep)
	if !strings.Contains(md, "| 1975 | 1075 | 0.54 |") {
		t.Fatalf("summary lacks the tenths' medians and their ratio:\n%s", md)
	}
	if !strings.Contains(md, "- strata: 1975 / 19.8 (2000);") {
		t.Fatalf("per-tenth line missing:\n%s", md)
	}
}

// TestGrowMarkdownSlowest: the intervals with the slowest writes are listed
// slowest first, each with what it waited on.
func TestGrowMarkdownSlowest(t *testing.T) {
	ss := samples([]float64{1000, 1000, 1000, 1000, 1000, 1000, 1000}, 0)
	for i := range ss {
		ss[i].Max = float64(10 + i)
	}
	ss[2].Max, ss[2].SlowFsyncs, ss[2].FsyncSeconds = 1684, 3, 1.5
	ss[5].Max, ss[5].WriteStallSeconds = 900, 0.75
	rep := &GrowReport{Settings: GrowSettings{IntervalSeconds: 10}, Runs: []GrowRun{{Server: "strata", Samples: ss}}}
	md := GrowMarkdown(rep)
	i := strings.Index(md, "The 5 intervals with the slowest writes")
	if i < 0 {
		t.Fatalf("no slowest-interval table:\n%s", md)
	}
	rows := strings.Split(strings.TrimSpace(md[i:]), "\n")[4:]
	if len(rows) != 5 {
		t.Fatalf("%d rows, want 5:\n%s", len(rows), md[i:])
	}
	for n, want := range []string{
		"| 30 | 3000 |", "| 1684.0 |", "| 3 | 1.50 | 0.00 |",
	} {
		if !strings.Contains(rows[0], want) {
			t.Errorf("slowest row %q lacks %q (%d)", rows[0], want, n)
		}
	}
	if !strings.HasPrefix(rows[1], "| 60 | 6000 |") || !strings.HasSuffix(rows[1], "| 0 | 0.00 | 0.75 |") {
		t.Errorf("second row %q, want the 900 ms interval with its stall", rows[1])
	}
	if !strings.HasPrefix(rows[4], "| 40 | 4000 |") {
		t.Errorf("fifth row %q, want t=40 (max 13 ms)", rows[4])
	}
}
