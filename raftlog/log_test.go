package raftlog

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/protobuf/proto"
)

// step is one operation of a scenario; exactly one of its actions is set.
type step struct {
	append   []*raftpb.Entry
	hs       *raftpb.HardState
	compact  uint64
	snapshot *raftpb.SnapshotMetadata
	reopen   bool
	wantErr  error // errors.Is target; nil means success
	anyErr   bool  // some error without a sentinel
}

func TestScenarios(t *testing.T) {
	cat := func(parts ...[]*raftpb.Entry) []*raftpb.Entry {
		var out []*raftpb.Entry
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	tests := []struct {
		name                string
		segSize             int64
		steps               []step
		snapIndex, snapTerm uint64
		want                []*raftpb.Entry
		wantHS              hardState
	}{{
		name:   "append and read",
		steps:  []step{{append: ents(1, 5, 1), hs: hs(1, 1, 3)}},
		want:   ents(1, 5, 1),
		wantHS: hardState{1, 1, 3},
	}, {
		name:   "empty log",
		steps:  []step{{reopen: true}},
		want:   nil,
		wantHS: hardState{},
	}, {
		name:   "hard state alone",
		steps:  []step{{hs: hs(4, 2, 0)}, {reopen: true}},
		wantHS: hardState{4, 2, 0},
	}, {
		name:   "conflict replaces the suffix",
		steps:  []step{{append: ents(1, 5, 1)}, {append: ents(3, 4, 2), hs: hs(2, 0, 2)}},
		want:   cat(ents(1, 2, 1), ents(3, 4, 2)),
		wantHS: hardState{2, 0, 2},
	}, {
		name:   "conflict survives reopen",
		steps:  []step{{append: ents(1, 5, 1)}, {append: ents(3, 4, 2), hs: hs(2, 0, 2)}, {reopen: true}},
		want:   cat(ents(1, 2, 1), ents(3, 4, 2)),
		wantHS: hardState{2, 0, 2},
	}, {
		name:   "entries that are not consecutive are refused",
		steps:  []step{{append: []*raftpb.Entry{ent(1, 1), ent(3, 1)}, anyErr: true}, {append: ents(1, 2, 1)}},
		want:   ents(1, 2, 1),
		wantHS: hardState{},
	}, {
		name:   "gap is refused and the log stays writable",
		steps:  []step{{append: ents(1, 3, 1)}, {append: ents(5, 6, 1), anyErr: true}, {append: ents(4, 4, 1)}},
		want:   ents(1, 4, 1),
		wantHS: hardState{},
	}, {
		name:      "log compaction",
		steps:     []step{{append: ents(1, 10, 1), hs: hs(1, 1, 10)}, {compact: 5}},
		snapIndex: 5, snapTerm: 1,
		want:   ents(6, 10, 1),
		wantHS: hardState{1, 1, 10},
	}, {
		name:      "log compaction survives reopen",
		steps:     []step{{append: ents(1, 10, 1), hs: hs(1, 1, 10)}, {compact: 5}, {reopen: true}},
		snapIndex: 5, snapTerm: 1,
		want:   ents(6, 10, 1),
		wantHS: hardState{1, 1, 10},
	}, {
		name:      "log compaction raises a lagging commit index",
		steps:     []step{{append: ents(1, 10, 1), hs: hs(1, 1, 3)}, {compact: 5}, {reopen: true}},
		snapIndex: 5, snapTerm: 1,
		want:   ents(6, 10, 1),
		wantHS: hardState{1, 1, 5},
	}, {
		name:   "log compaction beyond last index is refused",
		steps:  []step{{append: ents(1, 3, 1), hs: hs(1, 1, 3)}, {compact: 4, anyErr: true}},
		want:   ents(1, 3, 1),
		wantHS: hardState{1, 1, 3},
	}, {
		name:      "log compaction at the snapshot point is ErrCompacted",
		steps:     []step{{append: ents(1, 3, 1), hs: hs(1, 1, 3)}, {compact: 2}, {compact: 2, wantErr: raft.ErrCompacted}},
		snapIndex: 2, snapTerm: 1,
		want:   ents(3, 3, 1),
		wantHS: hardState{1, 1, 3},
	}, {
		name:      "entries at or below the snapshot point are ignored",
		steps:     []step{{append: ents(1, 10, 1), hs: hs(1, 1, 10)}, {compact: 5}, {append: ents(3, 7, 1)}, {reopen: true}},
		snapIndex: 5, snapTerm: 1,
		want:   ents(6, 7, 1),
		wantHS: hardState{1, 1, 10},
	}, {
		name: "apply snapshot discards the log",
		steps: []step{
			{append: ents(1, 5, 1), hs: hs(1, 1, 2)},
			{snapshot: &raftpb.SnapshotMetadata{Index: proto.Uint64(20), Term: proto.Uint64(3)}},
			{append: ents(21, 22, 3), hs: hs(3, 0, 20)},
			{reopen: true},
		},
		snapIndex: 20, snapTerm: 3,
		want:   ents(21, 22, 3),
		wantHS: hardState{3, 0, 20},
	}, {
		name: "apply snapshot raises commit and is durable alone",
		steps: []step{
			{append: ents(1, 5, 1), hs: hs(1, 1, 2)},
			{snapshot: &raftpb.SnapshotMetadata{Index: proto.Uint64(20), Term: proto.Uint64(3)}},
			{reopen: true},
		},
		snapIndex: 20, snapTerm: 3,
		wantHS: hardState{1, 1, 20},
	}, {
		name: "older snapshot is refused",
		steps: []step{
			{append: ents(1, 5, 1), hs: hs(1, 1, 5)}, {compact: 4},
			{snapshot: &raftpb.SnapshotMetadata{Index: proto.Uint64(3), Term: proto.Uint64(1)}, wantErr: raft.ErrSnapOutOfDate},
		},
		snapIndex: 4, snapTerm: 1,
		want:   ents(5, 5, 1),
		wantHS: hardState{1, 1, 5},
	}, {
		name:    "segments roll, conflict across segments, compaction deletes a prefix",
		segSize: 4096,
		steps: []step{
			{append: ents(1, 60, 1)}, {append: ents(61, 120, 1)}, {append: ents(121, 180, 1)},
			{append: ents(100, 130, 2), hs: hs(2, 0, 125)},
			{compact: 110},
			{reopen: true},
		},
		snapIndex: 110, snapTerm: 2,
		want:   ents(111, 130, 2),
		wantHS: hardState{2, 0, 125},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := vfs.NewMem()
			l := openLog(t, fs, tt.segSize)
			defer func() { _ = l.Close() }()
			for i, s := range tt.steps {
				var err error
				switch {
				case s.reopen:
					if err := l.Close(); err != nil {
						t.Fatalf("step %d: Close: %v", i, err)
					}
					l = openLog(t, fs, tt.segSize)
				case s.compact > 0:
					err = l.Compact(s.compact, &raftpb.ConfState{Voters: []uint64{1}})
				case s.snapshot != nil:
					err = l.ApplySnapshot(s.snapshot)
				default:
					err = l.Append(s.append, s.hs)
				}
				switch {
				case s.anyErr && err == nil:
					t.Fatalf("step %d: no error, want one", i)
				case s.wantErr != nil && !errors.Is(err, s.wantErr):
					t.Fatalf("step %d: error %v, want %v", i, err, s.wantErr)
				case !s.anyErr && s.wantErr == nil && err != nil:
					t.Fatalf("step %d: %v", i, err)
				}
			}
			checkLog(t, l, tt.snapIndex, tt.snapTerm, tt.want, tt.wantHS)
		})
	}
}

func TestCompactDeletesSegmentsAndKeepsConfState(t *testing.T) {
	fs := vfs.NewMem()
	l := openLog(t, fs, 4096)
	for i := uint64(0); i < 20; i++ {
		mustAppend(t, l, ents(i*20+1, i*20+20, 1), hs(1, 1, i*20+20))
	}
	before := l.Stats().Segments
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{7}}
	if err := l.Compact(390, cs); err != nil {
		t.Fatal(err)
	}
	after := l.Stats().Segments
	if before < 5 || after > 2 {
		t.Fatalf("segments before %d, after %d: want many, then at most 2", before, after)
	}
	names, _, err := listSegments(fs, testDir)
	if err != nil || len(names) != after {
		t.Fatalf("files %v (%v), want %d", names, err, after)
	}
	_ = l.Close()
	l = openLog(t, fs, 4096)
	defer l.Close()
	_, gotCS, err := l.InitialState()
	if err != nil || !sameConfState(gotCS, cs) {
		t.Fatalf("ConfState after reopen = %v, %v; want %v", gotCS, err, cs)
	}
	checkLog(t, l, 390, 1, ents(391, 400, 1), hardState{1, 1, 400})
}

func TestEntriesBoundsAndSizeLimit(t *testing.T) {
	l := openLog(t, vfs.NewMem(), 0)
	defer l.Close()
	mustAppend(t, l, ents(1, 10, 1), hs(1, 1, 10))
	if err := l.Compact(3, nil); err != nil {
		t.Fatal(err)
	}
	one := uint64(proto.Size(ent(5, 1)))
	tests := []struct {
		name    string
		lo, hi  uint64
		maxSize uint64
		wantErr error
		wantLen int
	}{
		{name: "compacted", lo: 3, hi: 5, maxSize: 1 << 30, wantErr: raft.ErrCompacted},
		{name: "beyond last", lo: 5, hi: 12, maxSize: 1 << 30, wantErr: raft.ErrUnavailable},
		{name: "empty range", lo: 5, hi: 5, maxSize: 1 << 30, wantLen: 0},
		{name: "all", lo: 4, hi: 11, maxSize: 1 << 30, wantLen: 7},
		{name: "at least one", lo: 4, hi: 11, maxSize: 0, wantLen: 1},
		{name: "limit", lo: 4, hi: 11, maxSize: 3*one + one/2, wantLen: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := l.Entries(tt.lo, tt.hi, tt.maxSize)
			if err != tt.wantErr { // raft compares with ==
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && len(got) != tt.wantLen {
				t.Fatalf("got %d entries, want %d", len(got), tt.wantLen)
			}
			if err == nil && len(got) > 0 {
				if err := sameEntries(got, ents(tt.lo, tt.lo+uint64(tt.wantLen)-1, 1)); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	if _, err := l.Term(2); err != raft.ErrCompacted {
		t.Fatalf("Term(2) err = %v, want ErrCompacted", err)
	}
	if _, err := l.Term(11); err != raft.ErrUnavailable {
		t.Fatalf("Term(11) err = %v, want ErrUnavailable", err)
	}
}

// TestEntriesFromDisk reads entries evicted from the in-memory tail, across
// segments and conflicts, before and after reopening.
func TestEntriesFromDisk(t *testing.T) {
	fs := vfs.NewMem()
	opts := Options{FS: fs, Dirs: []string{testDir}, SegmentSize: 8192, tailBudget: 1000}
	l, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	var want []*raftpb.Entry
	for i := uint64(0); i < 30; i++ {
		b := ents(i*10+1, i*10+10, 1)
		mustAppend(t, l, b, nil)
		want = append(want, b...)
	}
	mustAppend(t, l, ents(150, 160, 2), nil)
	want = append(want[:149], ents(150, 160, 2)...)
	if n := len(l.mu.mem.tail); n >= len(want) || n == 0 {
		t.Fatalf("tail holds %d of %d entries; the test needs eviction", n, len(want))
	}
	checkLog(t, l, 0, 0, want, hardState{})
	// A limited read stops inside the on-disk part.
	got, err := l.Entries(1, 161, uint64(proto.Size(ent(1, 1))*5))
	if err != nil || len(got) != 5 {
		t.Fatalf("limited Entries = %d entries, %v; want 5", len(got), err)
	}
	_ = l.Close()
	if l, err = Open(opts); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Recovery keeps positions, not data: every read comes from disk.
	if n := len(l.mu.mem.tail); n != 0 {
		t.Fatalf("tail holds %d entries after Open, want none", n)
	}
	checkLog(t, l, 0, 0, want, hardState{})
	// Appends after Open fill the tail again.
	mustAppend(t, l, ents(161, 165, 2), nil)
	want = append(want, ents(161, 165, 2)...)
	if n := len(l.mu.mem.tail); n != 5 {
		t.Fatalf("tail holds %d entries after an append of 5, want 5", n)
	}
	checkLog(t, l, 0, 0, want, hardState{})
}

func TestSyncFailureRefusesWrites(t *testing.T) {
	mem := vfs.NewMem()
	var toggle errorfs.Toggle
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpFileSyncData {
			return toggle.MaybeError(op)
		}
		return nil
	})
	toggle.Injector = errorfs.ErrInjected
	fs := errorfs.Wrap(mem, inj)
	l := openLog(t, fs, 0)
	mustAppend(t, l, ents(1, 3, 1), hs(1, 1, 0))
	toggle.On()
	if err := l.Append(ents(4, 4, 1), nil); !errors.Is(err, errorfs.ErrInjected) {
		t.Fatalf("Append with failing sync: %v, want the injected error", err)
	}
	toggle.Off()
	for name, err := range map[string]error{
		"Append":        l.Append(ents(4, 4, 1), nil),
		"Compact":       l.Compact(1, nil),
		"ApplySnapshot": l.ApplySnapshot(&raftpb.SnapshotMetadata{Index: proto.Uint64(9)}),
	} {
		if !errors.Is(err, ErrFailed) {
			t.Errorf("%s after failed sync: %v, want ErrFailed", name, err)
		}
	}
	// The failed entry was never made visible.
	if last, _ := l.LastIndex(); last != 3 {
		t.Fatalf("LastIndex = %d, want 3", last)
	}
	_ = l.Close()
	l = openLog(t, mem, 0)
	defer l.Close()
	if last, _ := l.LastIndex(); last < 3 {
		t.Fatalf("LastIndex after reopen = %d, want >= 3", last)
	}
}

func TestClosed(t *testing.T) {
	l := openLog(t, vfs.NewMem(), 0)
	mustAppend(t, l, ents(1, 2, 1), nil)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Entries(1, 2, 100); !errors.Is(err, ErrClosed) {
		t.Errorf("Entries after Close: %v", err)
	}
	if err := l.Append(ents(3, 3, 1), nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Append after Close: %v", err)
	}
	if err := l.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}

func TestOpenRejectsBadDirs(t *testing.T) {
	for _, dirs := range [][]string{nil, {"a", "a"}} {
		if _, err := Open(Options{FS: vfs.NewMem(), Dirs: dirs}); err == nil {
			t.Fatalf("Open with dirs %q succeeded", dirs)
		}
	}
}

// TestConcurrentReads runs raft.Storage readers against appends, conflicts
// and log compactions (meaningful under -race).
func TestConcurrentReads(t *testing.T) {
	l := openLog(t, vfs.NewMem(), 8192)
	l.mu.mem.budget = 2000
	defer l.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				first, _ := l.FirstIndex()
				last, _ := l.LastIndex()
				if last < first {
					continue
				}
				got, err := l.Entries(first, last+1, 1<<30)
				if err == raft.ErrCompacted || err == raft.ErrUnavailable {
					continue
				}
				if err != nil {
					errc <- err
					return
				}
				for i, e := range got {
					if e.GetIndex() != first+uint64(i) {
						errc <- errors.New("entries not consecutive")
						return
					}
				}
			}
		}()
	}
	for i := uint64(0); i < 200; i++ {
		mustAppend(t, l, ents(i*5+1, i*5+5, 1), hs(1, 1, i*5+5))
		if i%7 == 6 {
			mustAppend(t, l, ents(i*5+3, i*5+5, 1), nil)
		}
		if i%20 == 19 {
			if err := l.Compact(i*5, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
}

func TestInspect(t *testing.T) {
	fs := vfs.NewMem()
	l := openLog(t, fs, 4096)
	for i := uint64(0); i < 10; i++ {
		mustAppend(t, l, ents(i*20+1, i*20+20, 1), hs(1, 1, i*20+20))
	}
	st := l.Stats()
	_ = l.Close()
	infos, err := Inspect(fs, []string{testDir})
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != st.Segments || len(infos) < 2 {
		t.Fatalf("Inspect found %d segments, Stats says %d", len(infos), st.Segments)
	}
	var commands uint64
	next := uint64(1)
	for _, in := range infos {
		if in.FirstIndex != next || in.Commands != in.LastIndex-in.FirstIndex+1 || in.Records < 2 {
			t.Fatalf("segment %+v: want first index %d and contiguous entries", in, next)
		}
		next = in.LastIndex + 1
		commands += in.Commands
	}
	if commands != 200 || st.Entries != 200 || st.Appends != 10 || st.Fsyncs < 10 {
		t.Fatalf("commands %d, stats %+v", commands, st)
	}
}

// TestSpareSegments checks that segment rolls use the spare file prepared
// in the background, fall back to creating the segment when preparing the
// spare failed, and that no spare outlives Close.
func TestSpareSegments(t *testing.T) {
	for _, failSpare := range []bool{false, true} {
		t.Run(fmt.Sprintf("failSpare=%v", failSpare), func(t *testing.T) {
			mem := vfs.NewMem()
			fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
				if failSpare && op.Kind == errorfs.OpFilePreallocate && strings.Contains(op.Path, "spare-") {
					return errorfs.ErrInjected
				}
				return nil
			}))
			l := openLog(t, fs, 4096)
			for i := uint64(0); i < 40; i++ {
				mustAppend(t, l, ents(i*5+1, i*5+5, 1), nil)
			}
			if l.Stats().Segments < 3 {
				t.Fatalf("only %d segments; the test needs rolls", l.Stats().Segments)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			names, err := mem.List(testDir)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range names {
				if strings.Contains(n, "spare-") {
					t.Fatalf("spare %s left after Close", n)
				}
			}
			l = openLog(t, mem, 4096)
			defer l.Close()
			checkLog(t, l, 0, 0, ents(1, 200, 1), hardState{})
		})
	}
}

// TestSegmentSizeChange reopens a log with another SegmentSize: a segment
// keeps the size it was preallocated with (it is never written past its
// end because the option grew, which would make every fdatasync update
// the file's size), new segments get the new size, and nothing is lost.
func TestSegmentSizeChange(t *testing.T) {
	for _, c := range []struct {
		name          string
		before, after int64
	}{
		{name: "grows", before: 4 << 10, after: 64 << 10},
		{name: "shrinks", before: 64 << 10, after: 4 << 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := vfs.NewMem()
			l := openLog(t, fs, c.before)
			mustAppend(t, l, ents(1, 5, 1), hs(1, 1, 5))
			_ = l.Close()
			l = openLog(t, fs, c.after)
			for i := uint64(1); i < 60; i++ {
				mustAppend(t, l, ents(i*5+1, i*5+5, 1), hs(1, 1, i*5+5))
			}
			checkLog(t, l, 0, 0, ents(1, 300, 1), hardState{1, 1, 300})
			st := l.Stats()
			_ = l.Close()
			infos, err := Inspect(fs, []string{testDir})
			if err != nil {
				t.Fatal(err)
			}
			var disk int64
			for i, in := range infos {
				want := c.after
				if i == 0 {
					want = c.before
				}
				if in.FileBytes != want {
					t.Errorf("segment %d (%s, entries %d..%d): %d bytes, want its preallocated %d", i, in.Name, in.FirstIndex, in.LastIndex, in.FileBytes, want)
				}
				disk += in.FileBytes
			}
			if st.DiskBytes != disk {
				t.Errorf("Stats().DiskBytes = %d, the files hold %d", st.DiskBytes, disk)
			}
		})
	}
}

// TestSlowSyncWarnings: an fdatasync or a segment roll slower than
// WarnSyncDuration is logged, under etcd's message for the sync, so an
// operator sees why writes stalled; fast ones are not.
func TestSlowSyncWarnings(t *testing.T) {
	const warn, delay = 5 * time.Millisecond, 30 * time.Millisecond
	for _, tt := range []struct {
		name string
		slow func(op errorfs.Op) bool // which operations take delay
		want map[string]int           // warnings expected, by message
	}{
		{"fast disk", func(errorfs.Op) bool { return false }, map[string]int{}},
		{"slow fdatasync of the segments", func(op errorfs.Op) bool {
			return op.Kind == errorfs.OpFileSyncData && !strings.Contains(op.Path, "spare-")
		}, map[string]int{"slow fdatasync": 2}},
		{"slow directory sync", func(op errorfs.Op) bool {
			return op.Kind == errorfs.OpFileSync && op.Path == testDir
		}, map[string]int{"raftlog: slow segment roll": 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var slow atomic.Bool
			fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
				if slow.Load() && tt.slow(op) {
					time.Sleep(delay)
				}
				return nil
			}))
			core, logs := observer.New(zap.WarnLevel)
			l, err := Open(Options{FS: fs, Dirs: []string{testDir}, SegmentSize: 4096,
				WarnSyncDuration: warn, Logger: zap.New(core)})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			mustAppend(t, l, ents(1, 1, 1), nil) // starts preparing a spare
			slow.Store(true)
			mustAppend(t, l, nil, hs(1, 1, 1)) // one sync, no roll
			big := ents(2, 2, 1)
			big[0].Data = make([]byte, 3900) // does not fit: a roll, then one sync
			mustAppend(t, l, big, nil)
			slow.Store(false)
			got := map[string]int{}
			for _, e := range logs.TakeAll() {
				got[e.Message]++
				if took, ok := e.ContextMap()["took"].(time.Duration); !ok || took < delay {
					t.Errorf("%q: took = %v, want >= %v", e.Message, e.ContextMap()["took"], delay)
				}
			}
			if !maps.Equal(got, tt.want) {
				t.Fatalf("warnings %v, want %v", got, tt.want)
			}
		})
	}
}
