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
