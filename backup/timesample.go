package backup

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Time samples: what lets a point-in-time restore find the last state at
// or before a wall-clock time (docs/backup.md, "Point-in-time restore",
// rules 6 to 8). Raft entries carry no time; a member records, about once
// a second, which index it had applied when, and the archived log objects
// carry those records.

// SamplePeriod is how often the continuous mode samples the applied index:
// the granularity of a restore to a time.
const SamplePeriod = time.Second

// maxSamples bounds the samples a Sampler keeps in memory.
const maxSamples = 1 << 16

// sampleBytes is the encoded size of one TimeSample in a log object.
const sampleBytes = 16

// TimeSample says that every entry up to Index was applied by Time.
type TimeSample struct {
	Index uint64
	Time  time.Time
}

// Sampler keeps the member's recent TimeSamples until a log object holding
// them is archived.
//
// Invariants:
//  1. samples is ordered: by Index, and by Time among equal indexes (one
//     sampler reads one applied index that never goes down, and a
//     monotonic clock; a wall clock stepped back gives a sample no later
//     than the one before it, which is dropped).
//  2. Of a run of samples with one index only the first and the last are
//     kept: what they say is what the run says.
//  3. A sample is dropped only once an archived object holds it (drop),
//     or when maxSamples are held (the oldest first).
//
// Safe for concurrent use.
type Sampler struct {
	applied interface{ AppliedIndex() uint64 }
	now     func() time.Time

	mu      sync.Mutex
	samples []TimeSample // guarded by mu
}

// NewSampler returns a Sampler of applied's index on the clock now (nil:
// time.Now).
func NewSampler(applied interface{ AppliedIndex() uint64 }, now func() time.Time) *Sampler {
	if now == nil {
		now = time.Now
	}
	return &Sampler{applied: applied, now: now}
}

// Sample records the applied index now.
func (s *Sampler) Sample() {
	// Read the time after the index: the index was applied by then.
	idx := s.applied.AppliedIndex()
	at := s.now().UTC()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.samples)
	if n > 0 {
		last := s.samples[n-1]
		if idx < last.Index || !at.After(last.Time) {
			return // invariant 1
		}
		if n > 1 && last.Index == idx && s.samples[n-2].Index == idx {
			s.samples[n-1].Time = at // invariant 2
			return
		}
	}
	if n == maxSamples {
		s.samples = append(s.samples[:0], s.samples[maxSamples/4:]...)
	}
	s.samples = append(s.samples, TimeSample{Index: idx, Time: at})
}

// Run samples every period until ctx is done.
func (s *Sampler) Run(ctx context.Context, period time.Duration) {
	s.Sample()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sample()
		}
	}
}

// within returns a copy of the samples whose index is in first-1..last:
// those a log object of first..last carries (rule 7).
func (s *Sampler) within(first, last uint64) []TimeSample {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []TimeSample
	for _, x := range s.samples {
		if x.Index+1 >= first && x.Index <= last {
			out = append(out, x)
		}
	}
	return out
}

// drop forgets the samples whose index is at most last: an archived object
// holds them, or they are older than anything the archive will take.
func (s *Sampler) drop(last uint64) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i := 0
	for i < len(s.samples) && s.samples[i].Index <= last {
		i++
	}
	s.samples = append(s.samples[:0], s.samples[i:]...)
}

// encodeSamples returns the samples block of a log object: each sample as
// its index and its Unix time in nanoseconds, 8 bytes big-endian each.
func encodeSamples(samples []TimeSample) []byte {
	out := make([]byte, 0, len(samples)*sampleBytes)
	for _, x := range samples {
		out = binary.BigEndian.AppendUint64(out, x.Index)
		out = binary.BigEndian.AppendUint64(out, uint64(x.Time.UnixNano()))
	}
	return out
}

// decodeSamples decodes and checks the samples block of the log object
// first..last (FORMAT.md, "Archived log"): whole samples, ordered, every
// index in first-1..last.
func decodeSamples(raw []byte, first, last uint64) ([]TimeSample, error) {
	if len(raw)%sampleBytes != 0 {
		return nil, fmt.Errorf("%w: log object %d-%d: samples block of %d bytes", ErrCorrupt, first, last, len(raw))
	}
	out := make([]TimeSample, 0, len(raw)/sampleBytes)
	for i := 0; i < len(raw); i += sampleBytes {
		x := TimeSample{Index: binary.BigEndian.Uint64(raw[i:]), Time: time.Unix(0, int64(binary.BigEndian.Uint64(raw[i+8:]))).UTC()}
		if x.Index+1 < first || x.Index > last {
			return nil, fmt.Errorf("%w: log object %d-%d: a sample of index %d", ErrCorrupt, first, last, x.Index)
		}
		if n := len(out); n > 0 && (x.Index < out[n-1].Index || !x.Time.After(out[n-1].Time)) {
			return nil, fmt.Errorf("%w: log object %d-%d: samples out of order at index %d", ErrCorrupt, first, last, x.Index)
		}
		out = append(out, x)
	}
	return out, nil
}

// readSamples reads only the header and the samples block of the log
// object r (the entries are not read) and checks the block against its
// own SHA-256. An object of format 1 has no samples.
func readSamples(ctx context.Context, t Target, r LogRange) ([]TimeSample, error) {
	rc, err := t.Get(ctx, logName(r.First, r.Last))
	if err != nil {
		return nil, fmt.Errorf("read log object %d-%d: %w", r.First, r.Last, err)
	}
	defer rc.Close()
	br, h, err := readLogHeader(rc, r.First, r.Last)
	if err != nil {
		return nil, err
	}
	if h.Format == 1 {
		return nil, nil
	}
	// The header line carries no checksum of its own: the block is read as
	// it comes, so a damaged count costs what the object holds, not what
	// the count says (up to 1 GiB).
	raw, err := io.ReadAll(io.LimitReader(br, int64(h.Samples)*sampleBytes))
	if err != nil {
		return nil, fmt.Errorf("read log object %d-%d: %w", r.First, r.Last, err)
	}
	if len(raw) < h.Samples*sampleBytes {
		return nil, fmt.Errorf("%w: log object %d-%d: samples block ends early", ErrCorrupt, r.First, r.Last)
	}
	if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != h.SamplesSHA256 {
		return nil, fmt.Errorf("%w: log object %d-%d: samples sha256 mismatch", ErrCorrupt, r.First, r.Last)
	}
	return decodeSamples(raw, r.First, r.Last)
}

// ErrTimeRange: a restore was asked for a time the kept versions and the
// archived log cannot rebuild.
var ErrTimeRange = errors.New("backup: time out of the restorable range")

// timeFormat is how errors and results write times.
const timeFormat = "2006-01-02T15:04:05.000Z07:00"

// timePlan is what a restore to a time does: version, then the archived
// log up to Index, the last index known applied by Time.
type timePlan struct {
	version *Manifest
	// index is the last entry to restore (version.RaftIndex: replay
	// nothing); at is the time of the sample (or version) saying it was
	// applied.
	index uint64
	at    time.Time
}

// planToTime finds the state to restore for wall-clock time at (rule 8
// and "Restore to a wall-clock time" in docs/backup.md): the newest
// version created at or before at, then the largest index of an archived
// sample at or before at. It reads only manifests and samples blocks.
func planToTime(ctx context.Context, t Target, at time.Time) (timePlan, error) {
	list, err := List(ctx, t)
	if err != nil {
		return timePlan{}, err
	}
	var m *Manifest
	for _, v := range list {
		if !v.Created.After(at) && (m == nil || v.Version > m.Version) {
			m = v
		}
	}
	if m == nil {
		if len(list) == 0 {
			return timePlan{}, fmt.Errorf("%w: the target holds no version", ErrTimeRange)
		}
		oldest := list[0]
		for _, v := range list {
			if v.Created.Before(oldest.Created) {
				oldest = v
			}
		}
		return timePlan{}, fmt.Errorf("%w: %s is before the oldest version (version %d, created %s)",
			ErrTimeRange, at.Format(timeFormat), oldest.Version, oldest.Created.Format(timeFormat))
	}
	plan := timePlan{version: m, index: m.RaftIndex, at: m.Created}
	ranges, err := ArchivedLog(ctx, t)
	if err != nil {
		return timePlan{}, err
	}
	reach := TimeSample{Index: m.RaftIndex, Time: m.Created}
	next := m.RaftIndex + 1
	for _, r := range ranges {
		if r.Last < m.RaftIndex {
			continue
		}
		if r.First > next {
			return timePlan{}, fmt.Errorf("%w: entry %d (after version %d) is in no log object, the next starts at %d; the archive before the gap reaches %s (index %d)",
				ErrLogGap, next, m.Version, r.First, reach.Time.Format(timeFormat), reach.Index)
		}
		samples, err := readSamples(ctx, t, r)
		if err != nil {
			return timePlan{}, err
		}
		for _, x := range samples {
			if x.Index < m.RaftIndex {
				continue // before the version: it says nothing more
			}
			if x.Time.After(at) {
				return plan, nil // the first sample after at ends the search
			}
			if x.Index > plan.index || x.Index == plan.index && x.Time.After(plan.at) {
				plan.index, plan.at = x.Index, x.Time
			}
			reach = x
		}
		next = r.Last + 1
	}
	if at.After(reach.Time) {
		return timePlan{}, fmt.Errorf("%w: %s is after the last archived sample: the archive reaches %s (index %d)",
			ErrTimeRange, at.Format(timeFormat), reach.Time.Format(timeFormat), reach.Index)
	}
	return plan, nil
}

// LogRun is a run of archived log objects that continue each other, and
// the times of its first and last samples (zero if its objects hold
// none: format 1).
type LogRun struct {
	First, Last uint64
	From, To    time.Time
}

// ArchivedRuns returns the runs of the archived log of t, by index, each
// with the time range its samples cover (read from the samples blocks of
// its first and last objects that have samples).
func ArchivedRuns(ctx context.Context, t Target) ([]LogRun, error) {
	ranges, err := ArchivedLog(ctx, t)
	if err != nil {
		return nil, err
	}
	var runs []LogRun
	var objs [][]LogRange // the objects of each run
	for _, r := range ranges {
		if n := len(runs); n > 0 && r.First == runs[n-1].Last+1 {
			runs[n-1].Last = r.Last
			objs[n-1] = append(objs[n-1], r)
			continue
		}
		runs = append(runs, LogRun{First: r.First, Last: r.Last})
		objs = append(objs, []LogRange{r})
	}
	for i := range runs {
		for _, r := range objs[i] {
			s, err := readSamples(ctx, t, r)
			if err != nil {
				return nil, err
			}
			if len(s) > 0 {
				runs[i].From = s[0].Time
				break
			}
		}
		for j := len(objs[i]) - 1; j >= 0; j-- {
			s, err := readSamples(ctx, t, objs[i][j])
			if err != nil {
				return nil, err
			}
			if len(s) > 0 {
				runs[i].To = s[len(s)-1].Time
				break
			}
		}
	}
	return runs, nil
}
