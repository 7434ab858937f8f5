package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/node"
)

// sliceLog is a LogSource over entries held in memory, whose first index
// can be moved up (a truncated log).
type sliceLog struct {
	mu    sync.Mutex
	ents  []*raftpb.Entry // ents[i] has index first+i... after truncation
	first uint64
}

func (l *sliceLog) FirstIndex() (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first, nil
}

func (l *sliceLog) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lo < l.first {
		return nil, raft.ErrCompacted
	}
	var out []*raftpb.Entry
	for _, e := range l.ents {
		if e.GetIndex() >= lo && e.GetIndex() < hi {
			out = append(out, e)
		}
	}
	return out, nil
}

// truncate drops the entries below index i.
func (l *sliceLog) truncate(i uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.first = i
}

// applied is a member's apply path over the test member's store: entries
// go into a sliceLog and through an applier with a lessor, as a member
// applies them.
type applied struct {
	t    *testing.T
	m    *member
	log  *sliceLog
	app  *apply.Applier
	in   chan node.Committed
	next uint64
	id   uint64
	// states holds what the store answered at each revision reached.
	states map[int64]string
}

func newApplied(t *testing.T, m *member) *applied {
	t.Helper()
	lessor := lease.New(lease.Config{MinTTL: 2})
	if err := lessor.Load(m.store); err != nil {
		t.Fatal(err)
	}
	app, err := apply.New(apply.Config{Store: m.store, Lessor: lessor})
	if err != nil {
		t.Fatal(err)
	}
	a := &applied{t: t, m: m, log: &sliceLog{first: 1}, app: app, in: make(chan node.Committed), next: app.AppliedIndex() + 1,
		states: map[int64]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := app.Run(ctx, a.in); err != nil {
			t.Errorf("applier: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	a.record()
	return a
}

// propose appends the request as the next entry and applies it.
func (a *applied) propose(req *pb.InternalRaftRequest) {
	a.t.Helper()
	a.id++
	req.Header = &pb.RequestHeader{ID: a.id}
	data, err := proto.Marshal(req)
	if err != nil {
		a.t.Fatal(err)
	}
	e := &raftpb.Entry{Index: proto.Uint64(a.next), Term: proto.Uint64(1), Type: raftpb.EntryNormal.Enum(), Data: data}
	a.log.mu.Lock()
	a.log.ents = append(a.log.ents, e)
	a.log.mu.Unlock()
	a.in <- node.Committed{Entries: []*raftpb.Entry{e}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.app.WaitApplied(ctx, a.next); err != nil {
		a.t.Fatal(err)
	}
	a.next++
	a.record()
}

// record keeps what the store answers when it first reaches a revision:
// every key and HashKV. A later entry that leaves the revision as it is (a
// revision compaction, a lease grant) may change HashKV's answer there; a
// restore to a revision gives the first instant at it (docs/backup.md).
func (a *applied) record() {
	if _, ok := a.states[a.m.store.Rev()]; !ok {
		a.states[a.m.store.Rev()] = answer(a.t, a.m.store.Rev(), kvs(a.t, a.m.store), a.m.store.HashKV)
	}
}

func answer(t *testing.T, rev int64, kvs []string, hashKV func(int64) (uint32, int64, int64, error)) string {
	t.Helper()
	h, _, _, err := hashKV(rev)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("revision %d, HashKV %d\n%s", rev, h, strings.Join(kvs, "\n"))
}

func put(key, value string, lease int64) *pb.InternalRaftRequest {
	return &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(key), Value: []byte(value), Lease: lease}}
}

// TestPointInTime: versions plus the archived log restore the state at
// every revision from the oldest version's to the last archived entry's,
// exactly (keys, revisions, HashKV), through puts, deletes, a txn, a
// lease's grant and revocation and a revision compaction; a revision out
// of that range, a damaged or a missing log object are refused with
// nothing left behind; prune keeps the log the kept versions replay.
func TestPointInTime(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	a := newApplied(t, m)
	target := fileTarget(t)
	b := newBackuper(t, m, target)
	archive := func() {
		t.Helper()
		if _, err := b.ArchiveLog(ctx, a.log, a.app.AppliedIndex(), nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		a.propose(put(fmt.Sprintf("k%d", i), fmt.Sprint("v", i), 0))
	}
	archive() // no version yet: nothing to archive
	if l, err := ArchivedLog(ctx, target); err != nil || len(l) != 0 {
		t.Fatalf("archive before any version: %v, %v", l, err)
	}
	v1, err := b.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.propose(put("k1", "changed", 0))
	a.propose(&pb.InternalRaftRequest{DeleteRange: &pb.DeleteRangeRequest{Key: []byte("k2")}})
	a.propose(&pb.InternalRaftRequest{LeaseGrant: &pb.LeaseGrantRequest{ID: 7, TTL: 60}})
	a.propose(put("leased", "x", 7))
	a.propose(&pb.InternalRaftRequest{Txn: &pb.TxnRequest{
		Compare: []*pb.Compare{{Key: []byte("k3"), Target: pb.Compare_VERSION, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Version{Version: 1}}},
		Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k3"), Value: []byte("txn")}}}},
	}})
	archive()
	v2, err := b.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.propose(&pb.InternalRaftRequest{LeaseRevoke: &pb.LeaseRevokeRequest{ID: 7}})
	a.propose(&pb.InternalRaftRequest{Compaction: &pb.CompactionRequest{Revision: v2.Revision - 1}})
	a.propose(put("k9", "last", 0))
	a.propose(put("k0", "last", 0))
	archive()
	last := m.store.Rev()
	if v1.Revision >= v2.Revision || v2.Revision >= last {
		t.Fatalf("revisions: v1 %d, v2 %d, last %d", v1.Revision, v2.Revision, last)
	}

	restore := func(rev int64) (RestoreResult, string, error) {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "restored")
		cfg := restoreConfig(dir, 0)
		cfg.ToRevision = rev
		progress := &replayRecorder{}
		cfg.Progress = progress
		res, err := Restore(ctx, target, cfg)
		if err != nil {
			if _, serr := os.Stat(dir); serr == nil {
				t.Errorf("a refused restore to revision %d left %s", rev, dir)
			}
			return res, "", err
		}
		// The replay's progress: told once what is to go, then told it
		// all, in revisions.
		if want := rev - res.Manifest.Revision; res.ReplayedTo != 0 &&
			(progress.calls != 1 || progress.unit != "revisions" || progress.steps != want || progress.done != want) {
			t.Errorf("restore to revision %d from revision %d: replay progress %+v; want %d revisions told and done", rev, res.Manifest.Revision, progress, want)
		}
		s := openRestored(t, dir)
		return res, answer(t, s.Rev(), kvs(t, s), s.HashKV), nil
	}
	for rev := v1.Revision; rev <= last; rev++ {
		res, got, err := restore(rev)
		if err != nil {
			t.Errorf("restore to revision %d: %v", rev, err)
			continue
		}
		if got != a.states[rev] {
			t.Errorf("restored to revision %d:\n%s\nthe live store answered:\n%s", rev, got, a.states[rev])
		}
		wantVersion := v1.Version
		if rev >= v2.Revision {
			wantVersion = v2.Version
		}
		if res.Manifest.Version != wantVersion || (rev == res.Manifest.Revision) != (res.ReplayedTo == 0) {
			t.Errorf("revision %d: from version %d, replayed to %d; want version %d", rev, res.Manifest.Version, res.ReplayedTo, wantVersion)
		}
	}
	for _, rev := range []int64{v1.Revision - 1, last + 1} {
		if _, _, err := restore(rev); !errors.Is(err, ErrRevisionRange) {
			t.Errorf("restore to revision %d = %v, want ErrRevisionRange", rev, err)
		}
	}

	// A damaged log object, then a missing one.
	logs, err := ArchivedLog(ctx, target)
	if err != nil || len(logs) != 2 {
		t.Fatalf("archived log %v, %v; want two objects", logs, err)
	}
	p := filepath.Join(target.dir, filepath.FromSlash(logName(logs[0].First, logs[0].Last)))
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)-3] ^= 1
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := restore(v1.Revision + 1); !errors.Is(err, ErrCorrupt) {
		t.Errorf("restore over a damaged log object = %v, want ErrCorrupt", err)
	}
	if rep, err := VerifyLog(ctx, target); !errors.Is(err, ErrCorrupt) || len(rep.Bad) != 1 || rep.Objects != 2 ||
		!strings.Contains(rep.Bad[0], logName(logs[0].First, logs[0].Last)) {
		t.Errorf("VerifyLog over a damaged log object = %+v, %v; want it named", rep, err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if _, _, err := restore(v1.Revision + 1); !errors.Is(err, ErrNotHeld) || !strings.Contains(err.Error(), fmt.Sprintf("holds committed entries %d-%d", logs[1].First, logs[1].Last)) {
		t.Errorf("restore over a missing log object = %v, want ErrNotHeld naming the entries held", err)
	}
	if rep, err := VerifyLog(ctx, target); err != nil || rep.Objects != 1 || rep.Entries != int(logs[1].Last-logs[1].First+1) {
		t.Errorf("VerifyLog with the damaged object gone = %+v, %v", rep, err)
	}
	// Past version 2 the log is whole still.
	if _, got, err := restore(last); err != nil || got != a.states[last] {
		t.Errorf("restore to the last revision after the damage: %v", err)
	}

	// Prune to the newest version: the log before it goes, the log after
	// it stays.
	rep, err := b.Prune(ctx, Retention{KeepLast: 1})
	if err != nil {
		t.Fatal(err)
	}
	if logs, err := ArchivedLog(ctx, target); err != nil || len(logs) != 1 || logs[0].First != v2.RaftIndex+1 || rep.LogObjectsDeleted != 0 {
		t.Errorf("after prune: %v, %v, report %+v", logs, err, rep)
	}
}

// replayRecorder is a Progress that records what it is told of a
// replay (ReplayProgress).
type replayRecorder struct {
	noProgress
	calls       int
	steps, done int64
	unit        string
}

func (r *replayRecorder) Replaying(steps int64, unit string) {
	r.calls++
	r.steps, r.unit = steps, unit
}
func (r *replayRecorder) Replayed(steps int64) { r.done += steps }

// TestArchiveGap: archiving continues from the last archived entry while
// the log holds it; a log truncated past it is a gap, counted, and the
// archive restarts after the next version.
func TestArchiveGap(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	a := newApplied(t, m)
	target := fileTarget(t)
	b := newBackuper(t, m, target)
	a.propose(put("a", "1", 0))
	if _, err := b.Create(ctx); err != nil {
		t.Fatal(err)
	}
	a.propose(put("a", "2", 0))
	rep, err := b.ArchiveLog(ctx, a.log, a.app.AppliedIndex(), nil)
	if err != nil || rep.Entries != 1 {
		t.Fatalf("first archive: %+v, %v", rep, err)
	}
	if rep, err := b.ArchiveLog(ctx, a.log, a.app.AppliedIndex(), nil); err != nil || rep.Entries != 0 {
		t.Errorf("archive with nothing new: %+v, %v", rep, err)
	}
	a.propose(put("a", "3", 0))
	a.propose(put("a", "4", 0))
	a.log.truncate(a.app.AppliedIndex())
	if _, err := b.ArchiveLog(ctx, a.log, a.app.AppliedIndex(), nil); !errors.Is(err, ErrLogGap) {
		t.Errorf("archive over a truncated log = %v, want ErrLogGap", err)
	}
	if st := b.Stats(); st.LogGaps != 1 || st.LogEntries != 1 {
		t.Errorf("stats %+v, want one gap and one entry", st)
	}
	v2, err := b.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.propose(put("a", "5", 0))
	rep, err = b.ArchiveLog(ctx, a.log, a.app.AppliedIndex(), nil)
	if err != nil || rep.First != v2.RaftIndex+1 || rep.Entries != 1 {
		t.Errorf("archive after the next version: %+v, %v; want it to start at %d", rep, err, v2.RaftIndex+1)
	}
}

// TestDecodeLogRefusals: a log object's header and entries are checked
// before use.
func TestDecodeLogRefusals(t *testing.T) {
	ents := []*raftpb.Entry{{Index: proto.Uint64(5), Term: proto.Uint64(1)}, {Index: proto.Uint64(6), Term: proto.Uint64(1), Data: []byte("x")}}
	raw, err := encodeLog(ents, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := decodeLog(strings.NewReader(string(raw)), 5, 6); err != nil || len(got) != 2 || string(got[1].Data) != "x" {
		t.Fatalf("round trip: %v, %v", got, err)
	}
	for name, tc := range map[string]struct {
		raw         string
		first, last uint64
	}{
		"wrong name":     {raw: string(raw), first: 5, last: 7},
		"no header":      {raw: "garbage", first: 5, last: 6},
		"truncated":      {raw: string(raw[:len(raw)-1]), first: 5, last: 6},
		"flipped byte":   {raw: string(raw[:len(raw)-1]) + "y", first: 5, last: 6},
		"header only":    {raw: strings.SplitAfter(string(raw), "\n")[0], first: 5, last: 6},
		"empty":          {raw: "", first: 5, last: 6},
		"huge length":    {raw: `{"format":1,"first":5,"last":5,"sha256":"` + sha256Hex([]byte("\xff\xff\xff\xff\x0f")) + "\"}\n\xff\xff\xff\xff\x0f", first: 5, last: 5},
		"format unknown": {raw: strings.Replace(string(raw), `"format":2`, `"format":3`, 1), first: 5, last: 6},
	} {
		if _, _, err := decodeLog(strings.NewReader(tc.raw), tc.first, tc.last); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	if _, err := encodeLog([]*raftpb.Entry{{Index: proto.Uint64(1)}, {Index: proto.Uint64(3)}}, nil); err == nil {
		t.Error("encodeLog of entries with a hole succeeded")
	}
}

// TestServiceLogInterval: between versions, the continuous mode archives
// the applied log every LogInterval.
func TestServiceLogInterval(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	a := newApplied(t, m)
	target := fileTarget(t)
	a.propose(put("a", "1", 0))
	s, err := OpenService(ServiceConfig{
		Options: Options{Target: target.String(), Interval: time.Hour, LogInterval: time.Millisecond},
		Engine:  m.eng, ID: testID, StagingDir: t.TempDir(), Log: a.log, Applied: a.app,
	})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Create(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { s.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()
	for i := range 5 {
		a.propose(put("a", fmt.Sprint(i), 0))
	}
	want := a.app.AppliedIndex()
	waitFor(t, "the log archived up to the applied index", func() bool {
		logs, err := ArchivedLog(ctx, target)
		return err == nil && len(logs) > 0 && logs[0].First == v.RaftIndex+1 && logs[len(logs)-1].Last == want
	})
	// The counters are added once ArchiveLog returns, just after the
	// object is in the target.
	waitFor(t, "the archived entries counted", func() bool { return s.Stats().LogLastIndex == want })
	if st := s.Stats(); st.Versions != 1 || st.LogEntries != want-v.RaftIndex || st.LogLastIndex != want {
		t.Errorf("stats %+v: want one version and entries %d..%d archived", st, v.RaftIndex+1, want)
	}
}

// FuzzDecodeLog: a log object decoder never panics, refuses with
// ErrCorrupt, and what it accepts (entries and samples, format 1 or 2)
// encodes and decodes again to the same.
func FuzzDecodeLog(f *testing.F) {
	ents := []*raftpb.Entry{{Index: proto.Uint64(5), Term: proto.Uint64(2), Data: []byte("put")},
		{Index: proto.Uint64(6), Term: proto.Uint64(2), Type: raftpb.EntryConfChange.Enum()}}
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	good, err := encodeLog(ents, []TimeSample{{Index: 4, Time: at}, {Index: 6, Time: at.Add(time.Second)}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good, uint64(5), uint64(6))
	f.Add(encodeLogFormat1(f, ents), uint64(5), uint64(6))
	f.Add([]byte("{}\n"), uint64(1), uint64(1))
	f.Fuzz(func(t *testing.T, raw []byte, first, last uint64) {
		ents, samples, err := decodeLog(strings.NewReader(string(raw)), first, last)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again, err := encodeLog(ents, samples)
		if err != nil {
			t.Fatalf("accepted entries do not encode: %v", err)
		}
		ents2, samples2, err := decodeLog(strings.NewReader(string(again)), first, last)
		if err != nil {
			t.Fatalf("re-encoded object does not decode: %v", err)
		}
		if len(ents2) != len(ents) || len(samples2) != len(samples) {
			t.Fatalf("re-encoded: %d entries, %d samples; want %d, %d", len(ents2), len(samples2), len(ents), len(samples))
		}
		for i := range samples {
			if samples[i].Index != samples2[i].Index || !samples[i].Time.Equal(samples2[i].Time) {
				t.Fatalf("sample %d: %v, re-encoded %v", i, samples[i], samples2[i])
			}
		}
	})
}

// encodeLogFormat1 returns a log object as format 1 wrote it: no samples.
func encodeLogFormat1(tb testing.TB, ents []*raftpb.Entry) []byte {
	tb.Helper()
	raw, err := encodeLog(ents, nil)
	if err != nil {
		tb.Fatal(err)
	}
	line, body, _ := strings.Cut(string(raw), "\n")
	var h logHeader
	if err := json.Unmarshal([]byte(line), &h); err != nil {
		tb.Fatal(err)
	}
	h.Format, h.Samples, h.SamplesSHA256 = 1, 0, ""
	hb, err := json.Marshal(h)
	if err != nil {
		tb.Fatal(err)
	}
	return append(append(hb, '\n'), body...)
}

// TestPruneKeepsLogOfLowestIndex: versions are numbered in the order they
// were written, not by raft index. A lagging member's version (create
// --endpoints, or an old leader finishing late) can have a higher number
// and a lower index than the version before it; prune keeps the archived
// log from the lowest index of any kept version. It once kept it from the
// oldest-numbered kept version's index, and a point-in-time restore from
// the lagging version was then refused for the entries it deleted.
func TestPruneKeepsLogOfLowestIndex(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	a := newApplied(t, m)
	target := fileTarget(t)
	b := newBackuper(t, m, target)
	for i := range 3 {
		a.propose(put(fmt.Sprintf("k%d", i), "v", 0))
	}
	if _, err := b.Create(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		a.propose(put(fmt.Sprintf("k%d", i), "w", 0))
	}
	if _, err := b.ArchiveLog(ctx, a.log, a.app.AppliedIndex(), nil); err != nil {
		t.Fatal(err)
	}
	v2, err := b.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lagging := newMember(t)
	la := newApplied(t, lagging)
	for i := range 3 {
		la.propose(put(fmt.Sprintf("k%d", i), "v", 0))
	}
	v3, err := newBackuper(t, lagging, target).Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v3.Version <= v2.Version || v3.RaftIndex >= v2.RaftIndex {
		t.Fatalf("version %d at index %d after version %d at index %d; want a higher number at a lower index",
			v3.Version, v3.RaftIndex, v2.Version, v2.RaftIndex)
	}
	logs, err := ArchivedLog(ctx, target)
	if err != nil || len(logs) == 0 {
		t.Fatalf("archived log %v, %v", logs, err)
	}
	if _, err := b.Prune(ctx, Retention{KeepLast: 2}); err != nil {
		t.Fatal(err)
	}
	after, err := ArchivedLog(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(logs) {
		t.Fatalf("prune keeping versions at indexes %d and %d left log objects %v of %v: the replay after index %d needs them",
			v2.RaftIndex, v3.RaftIndex, after, logs, v3.RaftIndex)
	}
}
