package raftlog

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.etcd.io/raft/v3/raftpb"
)

// keepAll is a BatchBuilder that keeps every entry verbatim, so a test can
// check that nothing was lost.
func keepAll(entries []*raftpb.Entry) (*CompactedBatch, error) {
	b := &CompactedBatch{FirstIndex: entries[0].GetIndex(), LastIndex: entries[len(entries)-1].GetIndex(),
		LastTerm: entries[len(entries)-1].GetTerm()}
	for _, e := range entries {
		b.Records = append(b.Records, BatchRecord{Kind: RecordEntry, Index: e.GetIndex(), Entry: e})
	}
	return b, nil
}

// covered returns every entry the log holds, from its batch files and its
// segments, and checks they run from 1 without a gap.
func covered(t *testing.T, l *Log) []*raftpb.Entry {
	t.Helper()
	batches, err := l.CompactedBatches(0)
	if err != nil {
		t.Fatal(err)
	}
	var out []*raftpb.Entry
	for _, b := range batches {
		for _, r := range b.Records {
			if n := uint64(len(out)); r.Index <= n {
				out = out[:r.Index-1] // a batch and a later one may overlap after a crash
			}
			out = append(out, r.Entry)
		}
	}
	first, _ := l.FirstIndex()
	last, _ := l.LastIndex()
	if first > uint64(len(out))+1 {
		t.Fatalf("entries %d..%d are neither in a batch file nor in the log", len(out)+1, first-1)
	}
	out = out[:first-1]
	ents, err := l.Entries(first, last+1, 1<<62)
	if err != nil {
		t.Fatal(err)
	}
	return append(out, ents...)
}

func TestCompactOldestSegment(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("dirs%d", n), func(t *testing.T) { testCompactOldestSegment(t, testDirs(n)) })
	}
}

func testCompactOldestSegment(t *testing.T, dirs []string) {
	fs := vfs.NewMem()
	opts := Options{FS: fs, Dirs: dirs, SegmentSize: 4 << 10, MinStripeBytes: -1}
	l, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	var all []*raftpb.Entry
	for i := uint64(0); i < 60; i++ {
		e := ents(i*5+1, i*5+5, 1)
		all = append(all, e...)
		mustAppend(t, l, e, hs(1, 1, i*5+5))
	}
	if l.Stats().Segments < 2+len(dirs) {
		t.Fatalf("only %d segments", l.Stats().Segments)
	}
	// Nothing is compacted above upTo.
	if ok, err := l.CompactOldestSegment(3, keepAll); ok || err != nil {
		t.Fatalf("CompactOldestSegment(3) = %v, %v", ok, err)
	}
	n := 0
	for {
		ok, err := l.CompactOldestSegment(200, keepAll)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		n++
	}
	first, _ := l.FirstIndex()
	if n == 0 || first == 1 || first > 201 {
		t.Fatalf("%d segments compacted, first index %d", n, first)
	}
	if err := sameEntries(covered(t, l), all); err != nil {
		t.Fatal(err)
	}
	infos, err := Inspect(fs, dirs)
	if err != nil {
		t.Fatal(err)
	}
	batches := 0
	for _, in := range infos {
		if in.Compacted {
			batches++
		}
	}
	if batches != n {
		t.Fatalf("Inspect shows %d batch files, want %d", batches, n)
	}
	if st := l.Stats(); st.BatchFiles != n || st.SegmentsCompacted != uint64(n) || st.BatchCommands != first-1 ||
		st.BatchRecords != first-1 || st.BatchBytes == 0 {
		t.Fatalf("Stats = %+v after %d compactions up to %d", st, n, first-1)
	}
	_ = l.Close()
	if l, err = Open(opts); err != nil {
		t.Fatal(err)
	}
	if err := sameEntries(covered(t, l), all); err != nil {
		t.Fatalf("after reopen: %v", err)
	}
	// Compact (the engine holds entries durably) deletes batch files.
	if err := l.Compact(first-1, nil); err == nil {
		t.Fatal("Compact at the snapshot point succeeded")
	}
	if bs, _ := l.CompactedBatches(0); len(bs) != 0 {
		t.Fatalf("%d batch files left after Compact(%d)", len(bs), first-1)
	}
	_ = l.Close()
}

// TestCompactionCrash takes a power cut at every file operation of log
// compaction (before the batch file's rename, after it, during the state
// frame and the segment's deletion): every clone must open, and batch
// files plus log must still hold every entry.
func TestCompactionCrash(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("dirs%d", n), func(t *testing.T) { testCompactionCrash(t, testDirs(n)) })
	}
}

func testCompactionCrash(t *testing.T, dirs []string) {
	mem := vfs.NewCrashableMem()
	var clones []*vfs.MemFS
	var ops []string
	armed := false
	var mu sync.Mutex // the spare goroutine calls the injector too
	inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
		mu.Lock()
		defer mu.Unlock()
		if armed && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && !strings.Contains(op.Path, "spare-") {
			clones = append(clones, mem.CrashClone(vfs.CrashCloneCfg{}))
			ops = append(ops, fmt.Sprint(op.Kind, " ", op.Path))
		}
		return nil
	})
	fs := errorfs.Wrap(mem, inj)
	opts := Options{FS: fs, Dirs: dirs, SegmentSize: 4 << 10, MinStripeBytes: -1}
	l, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	var all []*raftpb.Entry
	for i := uint64(0); i < 60; i++ {
		e := ents(i*5+1, i*5+5, 1)
		all = append(all, e...)
		mustAppend(t, l, e, hs(1, 1, i*5+5))
	}
	mu.Lock()
	armed = true
	mu.Unlock()
	for range 2 {
		if ok, err := l.CompactOldestSegment(200, keepAll); !ok || err != nil {
			t.Fatalf("CompactOldestSegment = %v, %v", ok, err)
		}
	}
	mu.Lock()
	armed = false
	mu.Unlock()
	_ = l.Close()
	if len(clones) < 6 {
		t.Fatalf("only %d crash points", len(clones))
	}
	for i, c := range clones {
		l, err := Open(Options{FS: c, Dirs: dirs, SegmentSize: 4 << 10, MinStripeBytes: -1})
		if err != nil {
			t.Fatalf("crash at %s: Open: %v", ops[i], err)
		}
		if err := sameEntries(covered(t, l), all); err != nil {
			t.Fatalf("crash at %s: %v", ops[i], err)
		}
		for _, d := range dirs {
			names, _ := c.List(d)
			for _, n := range names {
				if strings.HasSuffix(n, tempSuffix) && !strings.HasPrefix(n, "spare-") {
					t.Fatalf("crash at %s: temporary file %s left after Open", ops[i], n)
				}
			}
		}
		_ = l.Close()
	}
	t.Logf("%d crash points", len(clones))
}
