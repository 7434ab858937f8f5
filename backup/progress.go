package backup

// Progress is told how far a long operation (Create, Restore) is, for a
// progress bar or progress lines (cmd/strata's renderer). Total comes
// once, when the work is known (a version's files and their bytes); Done
// then reports what was done since the last call: bytes as they are read
// or written, a file once it is finished. An operation calls its Progress
// from one goroutine, one call at a time, and never after it returned.
type Progress interface {
	Total(files int, bytes int64)
	Done(files int, bytes int64)
}

// ReplayProgress is what a restore's Progress may also implement to be
// told how far its log replay is (a point-in-time restore, or a log
// version on its base), which can take longer than the files' download:
// Replaying once, with the steps to go and what a step is ("revisions"
// to a revision, "entries" to an index), then Replayed with the steps
// done since the last call. It is called as Progress is: from one
// goroutine, never after the restore returned.
type ReplayProgress interface {
	Replaying(steps int64, unit string)
	Replayed(steps int64)
}

// replayTracker turns the replay's position (the index applied, the
// store's revision) into ReplayProgress calls.
type replayTracker struct {
	p         ReplayProgress // nil: the Progress does not implement it
	goal      replayGoal
	rev       func() int64 // the store's revision now
	baseRev   int64
	baseIndex uint64
	reported  int64
}

// newReplayTracker starts the replay's progress on p (if it implements
// ReplayProgress) from the state of version m, whose store is at rev().
func newReplayTracker(p Progress, m *Manifest, goal replayGoal, rev func() int64) *replayTracker {
	t := &replayTracker{goal: goal, rev: rev, baseRev: rev(), baseIndex: m.RaftIndex}
	t.p, _ = p.(ReplayProgress)
	if t.p == nil {
		return t
	}
	if goal.rev != 0 {
		t.p.Replaying(max(goal.rev-t.baseRev, 0), "revisions")
	} else {
		t.p.Replaying(int64(goal.index-min(goal.index, m.RaftIndex)), "entries")
	}
	return t
}

// update reports the replay at entry applied.
func (t *replayTracker) update(applied uint64) {
	if t.p == nil {
		return
	}
	done := int64(applied - t.baseIndex)
	if t.goal.rev != 0 {
		done = t.rev() - t.baseRev
	}
	if done > t.reported {
		t.p.Replayed(done - t.reported)
		t.reported = done
	}
}

// noProgress is the Progress of an operation given none.
type noProgress struct{}

func (noProgress) Total(int, int64) {}
func (noProgress) Done(int, int64)  {}

// progressOr returns p, or noProgress if p is nil.
func progressOr(p Progress) Progress {
	if p == nil {
		return noProgress{}
	}
	return p
}

// progressWriter reports every write's bytes to a Progress.
type progressWriter struct{ p Progress }

func (w progressWriter) Write(b []byte) (int, error) {
	w.p.Done(0, int64(len(b)))
	return len(b), nil
}
