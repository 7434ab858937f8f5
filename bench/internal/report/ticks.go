package report

import (
	"math"
	"strconv"

	"gonum.org/v1/plot"
)

// ticks125 marks a log axis at 1, 2 and 5 times each power of ten, so a
// range inside one decade still gets labels (gonum's LogTicks labels powers
// of ten only).
type ticks125 struct{}

// Ticks implements plot.Ticker.
func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= lo {
		return nil
	}
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		p := math.Pow(10, e)
		for _, m := range []float64{1, 2, 5} {
			v := m * p
			if v < lo || v > hi {
				continue
			}
			ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
		}
	}
	return ts
}

// tailX maps a percentile q in [0, 100) to 1/(1-q/100), the x coordinate of
// an HDR-style percentile plot: on a log axis the 90th, 99th and 99.9th
// percentiles are evenly spaced, so the tail is as visible as the median.
func tailX(q float64) float64 { return 1 / (1 - q/100) }

// tailTicks labels the tailX axis with the percentiles it stands for.
type tailTicks struct{}

// Ticks implements plot.Ticker.
func (tailTicks) Ticks(lo, hi float64) []plot.Tick {
	labels := []string{"0%", "90%", "99%", "99.9%", "99.99%", "99.999%", "99.9999%"}
	var ts []plot.Tick
	for i, l := range labels {
		v := math.Pow(10, float64(i))
		if v >= lo && v <= hi*1.0001 {
			ts = append(ts, plot.Tick{Value: v, Label: l})
		}
	}
	return ts
}
