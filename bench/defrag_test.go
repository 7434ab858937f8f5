package main

import (
	"testing"
	"time"
)

func TestGapTracker(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tests := []struct {
		name  string
		marks []int // completion times in ms after t0, in the order recorded
		want  time.Duration
	}{
		{name: "none", want: 0},
		{name: "first completion counts from the start", marks: []int{30}, want: 30 * time.Millisecond},
		{name: "largest gap in the middle", marks: []int{1, 2, 250, 251}, want: 248 * time.Millisecond},
		{name: "out-of-order completion is not a gap", marks: []int{10, 50, 40, 60}, want: 40 * time.Millisecond},
		{name: "equal times", marks: []int{5, 5, 5}, want: 5 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &gapTracker{last: t0}
			for _, m := range tt.marks {
				g.done(at(m))
			}
			if g.longest != tt.want {
				t.Errorf("longest gap = %v, want %v", g.longest, tt.want)
			}
		})
	}
}
