package logcompact

import (
	"fmt"
	"slices"
	"time"
)

// Recovery strategies (seed 000, section 3.4) for the batches after the
// store's applied index. Both end in the same state; they differ in what
// they write to get there.
const (
	// RecoveryNaive replays the batches in ascending order, one engine
	// batch each.
	RecoveryNaive = "naive"
	// RecoveryDescending reads the batches newest-first and keeps, per
	// key, only the records the history horizon still needs (for each key
	// the records down to and including its newest one at or below the
	// horizon), then applies that minimal set, with every kept entry, in
	// one engine batch.
	RecoveryDescending = "descending"
)

// A Run is what a Replayer writes in one engine batch: the records of
// FirstIndex..LastIndex after the store's applied index, with the
// revision raised to Revision first and the compact revision to
// CompactRevision after the kept entries (a revision compaction among them
// applies as it did), committed with LastIndex as the applied index.
type Run struct {
	FirstIndex, LastIndex     uint64
	Revision, CompactRevision int64
	Records                   []Record
}

// A Replayer writes runs to the store: the applier (apply.Applier), which
// knows how a kept entry applies.
type Replayer interface {
	// AppliedIndex is the store's applied index.
	AppliedIndex() uint64
	// ReplayRun writes r; minTTL is the lessor's minimum TTL, for lease
	// grants replayed before a lessor exists.
	ReplayRun(r Run, minTTL int64) error
}

// ReplayTimings says how long each recovery step took (seed 000, Table 4).
type ReplayTimings struct {
	Batches, Records, Applied int
	Select, Apply             time.Duration
}

// Replay replays batches (oldest first, as the log returns them) through
// r with strategy. horizon is the revision compaction point known to hold
// after recovery (the store's compact revision before replay is always
// safe). Batches at or below the applied index are skipped; the rest must
// follow it without a gap.
func Replay(r Replayer, batches []*Batch, strategy string, horizon, minTTL int64) (ReplayTimings, error) {
	var t ReplayTimings
	applied := r.AppliedIndex()
	var live []*Batch
	for _, b := range batches {
		if b.LastIndex > applied {
			live = append(live, b)
			t.Records += len(b.Records)
		}
	}
	t.Batches = len(live)
	if len(live) == 0 {
		return t, nil
	}
	if live[0].FirstIndex > applied+1 {
		return t, fmt.Errorf("logcompact: batch %d..%d does not follow the applied index %d", live[0].FirstIndex, live[0].LastIndex, applied)
	}
	for i := 1; i < len(live); i++ {
		if live[i].FirstIndex != live[i-1].LastIndex+1 {
			return t, fmt.Errorf("logcompact: batches %d..%d and %d..%d leave a gap",
				live[i-1].FirstIndex, live[i-1].LastIndex, live[i].FirstIndex, live[i].LastIndex)
		}
	}
	switch strategy {
	case RecoveryNaive, "":
		start := time.Now()
		for _, b := range live {
			run := Run{FirstIndex: b.FirstIndex, LastIndex: b.LastIndex, Revision: b.Revision,
				CompactRevision: b.CompactRevisionAfter(horizon), Records: b.Records}
			if err := r.ReplayRun(run, minTTL); err != nil {
				return t, err
			}
			t.Applied += len(b.Records)
		}
		t.Apply = time.Since(start)
		return t, nil
	case RecoveryDescending:
		start := time.Now()
		run := descendingRun(live, applied, horizon)
		t.Select = time.Since(start)
		start = time.Now()
		if err := r.ReplayRun(run, minTTL); err != nil {
			return t, err
		}
		t.Apply, t.Applied = time.Since(start), len(run.Records)
		return t, nil
	}
	return t, fmt.Errorf("logcompact: unknown recovery strategy %q (want %s or %s)", strategy, RecoveryNaive, RecoveryDescending)
}

// descendingRun is the one run that stands for live (consecutive batches
// after applied) under the descending strategy: walking back from the
// newest record, a key's records older than its newest one at or below
// the horizon are superseded there and dropped (see dropSuperseded), and
// the compact revision is raised to cover them, and to the batches' own.
func descendingRun(live []*Batch, applied uint64, horizon int64) Run {
	// newest[key] is the newest revision seen so far, walking back, that
	// is at or below the horizon.
	newest := map[string]int64{}
	var compactRev int64
	var keep [][]Record
	for i := len(live) - 1; i >= 0; i-- {
		compactRev = max(compactRev, live[i].CompactRevisionAfter(horizon))
		recs := live[i].Records
		var kept []Record
		for j := len(recs) - 1; j >= 0; j-- {
			r := recs[j]
			if r.Index <= applied {
				break
			}
			if r.Kind != RecordEntry {
				if n, ok := newest[string(r.Key)]; ok {
					compactRev = max(compactRev, n)
					continue
				}
				if r.Main <= horizon {
					newest[string(r.Key)] = r.Main
				}
			}
			kept = append(kept, r)
		}
		slices.Reverse(kept)
		keep = append(keep, kept)
	}
	slices.Reverse(keep)
	last := live[len(live)-1]
	return Run{FirstIndex: live[0].FirstIndex, LastIndex: last.LastIndex, Revision: last.Revision,
		CompactRevision: compactRev, Records: slices.Concat(keep...)}
}
