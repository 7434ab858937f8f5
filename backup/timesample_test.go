package backup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// fakeApplied is an applied index set by the test.
type fakeApplied struct{ i atomic.Uint64 }

func (f *fakeApplied) AppliedIndex() uint64 { return f.i.Load() }

// TestSampler: samples are kept in order, a run of one index keeps its
// first and last, a clock stepped back adds nothing, within gives an
// object's range (first-1..last) and drop forgets what was archived.
func TestSampler(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	for _, tc := range []struct {
		name  string
		steps []TimeSample // applied index and clock at each Sample
		want  []TimeSample
	}{
		{"one a second", []TimeSample{{1, sec(0)}, {2, sec(1)}, {5, sec(2)}}, []TimeSample{{1, sec(0)}, {2, sec(1)}, {5, sec(2)}}},
		{"idle run: first and last", []TimeSample{{3, sec(0)}, {3, sec(1)}, {3, sec(2)}, {3, sec(3)}, {4, sec(4)}},
			[]TimeSample{{3, sec(0)}, {3, sec(3)}, {4, sec(4)}}},
		{"clock stepped back", []TimeSample{{3, sec(5)}, {4, sec(4)}, {5, sec(6)}}, []TimeSample{{3, sec(5)}, {5, sec(6)}}},
		{"same instant", []TimeSample{{3, sec(5)}, {4, sec(5)}}, []TimeSample{{3, sec(5)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var applied fakeApplied
			var clock time.Time
			s := NewSampler(&applied, func() time.Time { return clock })
			for _, st := range tc.steps {
				applied.i.Store(st.Index)
				clock = st.Time
				s.Sample()
			}
			if got := s.within(0, ^uint64(0)-1); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("samples %v, want %v", got, tc.want)
			}
		})
	}

	var applied fakeApplied
	var clock time.Time
	s := NewSampler(&applied, func() time.Time { return clock })
	for i, idx := range []uint64{4, 5, 7, 9, 9, 12} {
		applied.i.Store(idx)
		clock = sec(i)
		s.Sample()
	}
	if got, want := s.within(6, 9), []TimeSample{{5, sec(1)}, {7, sec(2)}, {9, sec(3)}, {9, sec(4)}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("within(6, 9) = %v, want %v", got, want)
	}
	s.drop(9)
	if got, want := s.within(0, 100), []TimeSample{{12, sec(5)}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after drop(9): %v, want %v", got, want)
	}
	for i := range maxSamples + 10 {
		applied.i.Store(uint64(100 + i))
		clock = sec(10 + i)
		s.Sample()
	}
	if got := s.within(0, ^uint64(0)-1); len(got) > maxSamples || got[len(got)-1].Index != uint64(100+maxSamples+9) {
		t.Errorf("after %d samples: %d kept, the last %v", maxSamples+10, len(got), got[len(got)-1])
	}
}

// TestRestoreToTime: on a fake clock, versions, samples and the archived
// log restore, for every time from the oldest version to the last
// archived sample in half-second steps, exactly the state the live store
// was in at the last sample (or version) at or before that time; a time
// before the oldest version or after the archive's reach is refused,
// naming the reach; a gap and a damaged samples block are refused;
// `backup list`'s runs carry the archive's time range.
func TestRestoreToTime(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	a := newApplied(t, m)
	target := fileTarget(t)
	clock := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	now := func() time.Time { return clock }
	b := New(Config{Engine: m.eng, Target: target, ID: testID, StagingDir: t.TempDir(), Now: now})
	s := NewSampler(a.app, now)

	// events are the instants the test knows the live state at: each
	// sample and each version, with what the store answered then.
	type event struct {
		at    time.Time
		state string
	}
	var events []event
	state := func() string { return answer(t, m.store.Rev(), kvs(t, m.store), m.store.HashKV) }
	tick := func() { clock = clock.Add(time.Second) }
	sample := func() {
		tick()
		s.Sample()
		events = append(events, event{clock, state()})
	}
	version := func() *Manifest {
		tick()
		v, err := b.Create(ctx)
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, event{clock, state()})
		return v
	}
	archive := func() {
		t.Helper()
		if _, err := b.ArchiveLog(ctx, a.log, a.app.AppliedIndex(), s); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		a.propose(put(fmt.Sprintf("k%d", i), "v0", 0))
	}
	sample() // before any version: nothing restores to it
	events = events[:0]
	v1 := version()
	a.propose(put("k1", "a", 0))
	a.propose(put("k2", "a", 0))
	sample()
	a.propose(put("k3", "a", 0))
	sample()
	sample() // idle
	archive()
	a.propose(put("k1", "b", 0))
	sample()
	a.propose(put("k4", "b", 0))
	a.propose(put("k4", "c", 0))
	sample()
	archive()
	v2 := version()
	a.propose(put("k0", "d", 0))
	sample()
	archive()
	a.propose(put("k0", "e", 0)) // archived, but no sample yet says when it was applied
	archive()
	last := events[len(events)-1].at

	restore := func(at time.Time) (RestoreResult, string, error) {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "restored")
		cfg := restoreConfig(dir, 0)
		cfg.ToTime = at
		res, err := Restore(ctx, target, cfg)
		if err != nil {
			if _, serr := os.Stat(dir); serr == nil {
				t.Errorf("a refused restore to %s left %s", at, dir)
			}
			return res, "", err
		}
		st := openRestored(t, dir)
		return res, answer(t, st.Rev(), kvs(t, st), st.HashKV), nil
	}
	for at := v1.Created; !at.After(last); at = at.Add(500 * time.Millisecond) {
		var want event
		for _, e := range events {
			if !e.at.After(at) {
				want = e
			}
		}
		res, got, err := restore(at)
		if err != nil {
			t.Errorf("restore to %s: %v", at.Format(timeFormat), err)
			continue
		}
		if got != want.state {
			t.Errorf("restored to %s:\n%s\nthe live store was, at %s:\n%s", at.Format(timeFormat), got, want.at.Format(timeFormat), want.state)
		}
		if !res.StateTime.Equal(want.at) {
			t.Errorf("restore to %s: state time %s, want %s", at.Format(timeFormat), res.StateTime.Format(timeFormat), want.at.Format(timeFormat))
		}
		if wantV := map[bool]uint64{false: v1.Version, true: v2.Version}[!at.Before(v2.Created)]; res.Manifest.Version != wantV {
			t.Errorf("restore to %s from version %d, want %d", at.Format(timeFormat), res.Manifest.Version, wantV)
		}
	}
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{v1.Created.Add(-time.Millisecond), "before the oldest version (version 1, created 2026-11-25T10:00:02.000Z)"},
		{last.Add(time.Millisecond), fmt.Sprintf("the archive reaches %s (index %d)", last.Format(timeFormat), a.app.AppliedIndex()-1)},
	} {
		if _, _, err := restore(tc.at); !errors.Is(err, ErrTimeRange) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("restore to %s = %v, want ErrTimeRange saying %q", tc.at.Format(timeFormat), err, tc.want)
		}
	}

	runs, err := ArchivedRuns(ctx, target)
	if err != nil || len(runs) != 1 || runs[0].First != v1.RaftIndex+1 || !runs[0].From.Equal(v1.Created.Add(-time.Second)) || !runs[0].To.Equal(last) {
		t.Errorf("ArchivedRuns = %+v, %v; want one run from index %d, %s to %s", runs, err, v1.RaftIndex+1, v1.Created.Add(-time.Second), last)
	}

	// A damaged samples block, then a missing object (a gap).
	logs, err := ArchivedLog(ctx, target)
	if err != nil || len(logs) < 3 {
		t.Fatalf("archived log %v, %v; want at least three objects", logs, err)
	}
	p := filepath.Join(target.dir, filepath.FromSlash(logName(logs[1].First, logs[1].Last)))
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	nl := strings.IndexByte(string(raw), '\n')
	raw[nl+3] ^= 1 // in the first sample's index
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := restore(last); !errors.Is(err, ErrCorrupt) {
		t.Errorf("restore over a damaged samples block = %v, want ErrCorrupt", err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if runs, err := ArchivedRuns(ctx, target); err != nil || len(runs) != 2 || runs[0].Last != logs[0].Last || runs[1].First != logs[2].First ||
		!runs[1].To.Equal(last) {
		t.Errorf("ArchivedRuns with object %d-%d gone = %+v, %v; want two runs", logs[1].First, logs[1].Last, runs, err)
	}
	if _, _, err := restore(v2.Created.Add(-time.Millisecond)); !errors.Is(err, ErrLogGap) {
		t.Errorf("restore across a missing log object = %v, want ErrLogGap", err)
	}
	if _, got, err := restore(last); err != nil || got != events[len(events)-1].state {
		t.Errorf("restore to %s, after version 2 and the gap: %v", last.Format(timeFormat), err)
	}
}

// TestRestoreToTimeFormat1: log objects of format 1 (no samples) still
// replay for a revision; a restore to a time cannot pass them and says
// where the archive's times end.
func TestRestoreToTimeFormat1(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	a := newApplied(t, m)
	target := fileTarget(t)
	clock := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	b := New(Config{Engine: m.eng, Target: target, ID: testID, StagingDir: t.TempDir(), Now: func() time.Time { return clock }})
	a.propose(put("a", "1", 0))
	v, err := b.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.propose(put("a", "2", 0))
	a.propose(put("a", "3", 0))
	ents, err := a.log.Entries(v.RaftIndex+1, a.app.AppliedIndex()+1, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	raw := encodeLogFormat1(t, ents)
	if err := target.Put(ctx, logName(v.RaftIndex+1, a.app.AppliedIndex()), strings.NewReader(string(raw)), int64(len(raw))); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "r")
	cfg := restoreConfig(dir, 0)
	cfg.ToRevision = m.store.Rev()
	if res, err := Restore(ctx, target, cfg); err != nil || res.ReplayedTo != a.app.AppliedIndex() {
		t.Errorf("restore to revision %d over a format 1 object: %+v, %v", cfg.ToRevision, res, err)
	}
	cfg = restoreConfig(filepath.Join(t.TempDir(), "r"), 0)
	cfg.ToTime = clock.Add(time.Minute)
	if _, err := Restore(ctx, target, cfg); !errors.Is(err, ErrTimeRange) || !strings.Contains(err.Error(), "the archive reaches 2026-11-25T10:00:00.000Z") {
		t.Errorf("restore to a time over a format 1 object = %v, want ErrTimeRange", err)
	}
	if runs, err := ArchivedRuns(ctx, target); err != nil || len(runs) != 1 || !runs[0].From.IsZero() {
		t.Errorf("ArchivedRuns = %+v, %v; want one run with no times", runs, err)
	}
	if rep, err := VerifyLog(ctx, target); err != nil || rep.Entries != 2 {
		t.Errorf("VerifyLog of a format 1 object = %+v, %v", rep, err)
	}
}

// TestEncodeLogSamplesChecked: the writer refuses samples outside the
// object's range or out of order.
func TestEncodeLogSamplesChecked(t *testing.T) {
	ents := []*raftpb.Entry{{Index: proto.Uint64(5)}, {Index: proto.Uint64(6)}}
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	for name, samples := range map[string][]TimeSample{
		"below first-1":  {{Index: 3, Time: at}},
		"above last":     {{Index: 7, Time: at}},
		"time backwards": {{Index: 5, Time: at}, {Index: 6, Time: at.Add(-time.Second)}},
		"index down":     {{Index: 6, Time: at}, {Index: 5, Time: at.Add(time.Second)}},
	} {
		if _, err := encodeLog(ents, samples); err == nil {
			t.Errorf("%s: encodeLog accepted %v", name, samples)
		}
	}
}

// TestDamagedSampleCountAllocatesLittle: the header line of a log object
// has no checksum of its own, and a damaged sample count (up to 2^26, 1 GiB
// of samples) once made readSamples allocate the block it names before
// reading a byte of it. The object is refused as corrupt, allocating about
// what it holds.
func TestDamagedSampleCountAllocatesLittle(t *testing.T) {
	ctx := context.Background()
	target := fileTarget(t)
	header := fmt.Sprintf(`{"format":2,"first":5,"last":6,"samples":%d,"samples_sha256":"%064d","sha256":"%064d"}`+"\n",
		maxLogObjectBytes/sampleBytes, 0, 0)
	body := header + strings.Repeat("x", 64)
	if err := target.Put(ctx, logName(5, 6), strings.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := readSamples(ctx, target, LogRange{First: 5, Last: 6})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("readSamples of a damaged count = %v, want ErrCorrupt", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("reading a 64-byte samples block whose header names 1 GiB allocated %d MiB", grew>>20)
	}
}
