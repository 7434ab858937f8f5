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
