package logcompact

import "testing"

type appliedAt uint64

func (a appliedAt) AppliedIndex() uint64 { return uint64(a) }

type keptAt struct {
	index uint64
	held  bool
}

func (k keptAt) LogKeptFor() (uint64, bool) { return k.index, k.held }

// TestCompactableUpTo: a batch stands only for applied entries, less the
// catch-up margin with --log-compaction-batch (invariant 1), and never past
// what the cluster's strata loggers hold with --logger-retention
// (invariant 6), a logger never heard of holding everything.
func TestCompactableUpTo(t *testing.T) {
	for _, tt := range []struct {
		name      string
		applied   uint64
		batch     uint64
		catchUp   uint64
		retention Retention
		want      uint64
	}{
		{name: "segments: the applied index", applied: 500, want: 500},
		{name: "batches: less the catch-up margin", applied: 500, batch: 50, catchUp: 100, want: 400},
		{name: "batches: nothing within the margin", applied: 100, batch: 50, catchUp: 100, want: 0},
		{name: "a logger holds less", applied: 500, retention: keptAt{index: 320, held: true}, want: 320},
		{name: "a logger holds more", applied: 500, retention: keptAt{index: 900, held: true}, want: 500},
		{name: "a logger never heard of", applied: 500, batch: 50, catchUp: 10, retention: keptAt{held: true}, want: 0},
		{name: "no logger holds anything back", applied: 500, batch: 50, catchUp: 10, retention: keptAt{}, want: 490},
		{name: "a logger below the margin", applied: 500, batch: 50, catchUp: 100, retention: keptAt{index: 250, held: true}, want: 250},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCompactor(CompactorConfig{Config: Config{BatchEntries: tt.batch}, Applied: appliedAt(tt.applied),
				CatchUpEntries: tt.catchUp, Retention: tt.retention})
			if got := c.compactableUpTo(); got != tt.want {
				t.Errorf("compactableUpTo() = %d, want %d", got, tt.want)
			}
		})
	}
}
