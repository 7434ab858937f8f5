package raftlog

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// keepAll is a BatchBuilder that keeps every entry verbatim in the
// payload (payloadEntries reads them back), so a test can check that
// nothing was lost. The log never reads a payload; this one is the tests'.
func keepAll(entries []*raftpb.Entry) (*CompactedBatch, error) {
	b := &CompactedBatch{FirstIndex: entries[0].GetIndex(), LastIndex: entries[len(entries)-1].GetIndex(),
		LastTerm: entries[len(entries)-1].GetTerm(), Records: uint64(len(entries)), PayloadFormat: testPayloadFormat}
	for _, e := range entries {
		data, err := proto.Marshal(e)
		if err != nil {
			return nil, err
		}
		b.Payload = binary.LittleEndian.AppendUint32(b.Payload, uint32(len(data)))
		b.Payload = append(b.Payload, data...)
	}
	return b, nil
}

// testPayloadFormat is the payload format of keepAll's batches.
const testPayloadFormat = 99

// payloadEntries is the inverse of keepAll.
func payloadEntries(t *testing.T, b *CompactedBatch) []*raftpb.Entry {
	t.Helper()
	if b.PayloadFormat != testPayloadFormat {
		t.Fatalf("batch %d..%d of payload format %d", b.FirstIndex, b.LastIndex, b.PayloadFormat)
	}
	var out []*raftpb.Entry
	for p := b.Payload; len(p) > 0; {
		n := int(binary.LittleEndian.Uint32(p))
		e := &raftpb.Entry{}
		if err := proto.Unmarshal(p[4:4+n], e); err != nil {
			t.Fatal(err)
		}
		out, p = append(out, e), p[4+n:]
	}
	if uint64(len(out)) != b.Records {
		t.Fatalf("batch %d..%d holds %d entries, says %d", b.FirstIndex, b.LastIndex, len(out), b.Records)
	}
	return out
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
		for _, e := range payloadEntries(t, b) {
			if n := uint64(len(out)); e.GetIndex() <= n {
				out = out[:e.GetIndex()-1] // a batch and a later one may overlap after a crash
			}
			out = append(out, e)
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

// openFilled opens a log of 4 KiB segments on fs and appends 300 entries
// of term 1 to it, 5 per Append (several segments in every directory). It
// returns the options it opened the log with, to reopen it, and the entries.
func openFilled(t *testing.T, fs vfs.FS, dirs []string) (Options, *Log, []*raftpb.Entry) {
	t.Helper()
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
	return opts, l, all
}

func TestCompactOldestSegment(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("dirs%d", n), func(t *testing.T) { testCompactOldestSegment(t, testDirs(n)) })
	}
}

func testCompactOldestSegment(t *testing.T, dirs []string) {
	fs := vfs.NewMem()
	opts, l, all := openFilled(t, fs, dirs)
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
//
// The unit is a whole segment (batch 0) or, as with --log-compaction-batch,
// a run of a random number of entries.
func TestCompactionCrash(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	for _, n := range []int{1, 2} {
		for _, batch := range []uint64{0, 3 + rng.Uint64N(60), 3 + rng.Uint64N(60)} {
			t.Run(fmt.Sprintf("dirs%d/batch%d", n, batch), func(t *testing.T) { testCompactionCrash(t, testDirs(n), batch) })
		}
	}
}

func testCompactionCrash(t *testing.T, dirs []string, batch uint64) {
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
	_, l, all := openFilled(t, fs, dirs)
	mu.Lock()
	armed = true
	mu.Unlock()
	for range 2 {
		var ok bool
		var err error
		if batch == 0 {
			ok, err = l.CompactOldestSegment(200, keepAll)
		} else {
			ok, err = l.CompactNextBatch(200, batch, keepAll)
		}
		if !ok || err != nil {
			t.Fatalf("log compaction = %v, %v", ok, err)
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
		if err := batchesEndAtSnapshot(l); err != nil {
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

// batchesEndAtSnapshot checks the invariant Open restores after a crash:
// the batch files are consecutive and the newest ends at the snapshot
// point (a batch beyond it, left by a compaction cut short, is deleted).
func batchesEndAtSnapshot(l *Log) error {
	batches, err := l.CompactedBatches(0)
	if err != nil {
		return err
	}
	first, _ := l.FirstIndex()
	for i, b := range batches {
		if i > 0 && b.FirstIndex != batches[i-1].LastIndex+1 {
			return fmt.Errorf("batch %d..%d follows batch %d..%d", b.FirstIndex, b.LastIndex,
				batches[i-1].FirstIndex, batches[i-1].LastIndex)
		}
	}
	if n := len(batches); n > 0 && batches[n-1].LastIndex != first-1 {
		return fmt.Errorf("newest batch ends at %d, snapshot point %d", batches[n-1].LastIndex, first-1)
	}
	return nil
}

// TestCompactNextBatch compacts runs of a random number of entries
// (--log-compaction-batch) with one to three directories: every batch
// stands for exactly that many entries, the batch files take turns among
// the directories, a segment goes only once every entry in it is below
// the snapshot point, Inspect counts what is live, and all of it survives
// a reopen.
func TestCompactNextBatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, n := range []int{1, 2, 3} {
		for range 3 {
			batch := 1 + rng.Uint64N(70)
			t.Run(fmt.Sprintf("dirs%d/batch%d", n, batch), func(t *testing.T) { testCompactNextBatch(t, testDirs(n), batch) })
		}
	}
}

func testCompactNextBatch(t *testing.T, dirs []string, batch uint64) {
	fs := vfs.NewMem()
	opts, l, all := openFilled(t, fs, dirs)
	const upTo = 200
	// Nothing while fewer than batch entries are at or below upTo.
	if ok, err := l.CompactNextBatch(batch-1, batch, keepAll); ok || err != nil {
		t.Fatalf("CompactNextBatch(%d, %d) = %v, %v", batch-1, batch, ok, err)
	}
	if _, err := l.CompactNextBatch(upTo, 0, keepAll); err == nil {
		t.Fatal("CompactNextBatch with a batch of 0 entries succeeded")
	}
	n := uint64(0)
	for {
		ok, err := l.CompactNextBatch(upTo, batch, keepAll)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		n++
	}
	if n != upTo/batch {
		t.Fatalf("%d batches of %d entries up to %d, want %d", n, batch, upTo, upTo/batch)
	}
	snap := n * batch
	check := func(l *Log) {
		t.Helper()
		if first, _ := l.FirstIndex(); first != snap+1 {
			t.Fatalf("first index %d, want %d", first, snap+1)
		}
		if err := sameEntries(covered(t, l), all); err != nil {
			t.Fatal(err)
		}
		if err := batchesEndAtSnapshot(l); err != nil {
			t.Fatal(err)
		}
		infos, err := Inspect(fs, dirs)
		if err != nil {
			t.Fatal(err)
		}
		var batches, live, logSnap uint64
		for _, in := range infos {
			logSnap = max(logSnap, in.SnapshotIndex)
			if in.Compacted {
				// Batch k (from 0) starts at k*batch+1 and is in dirs[k % len(dirs)].
				k := (in.FirstIndex - 1) / batch
				if in.Commands != batch || in.Records != int(batch) || in.FirstIndex != k*batch+1 ||
					in.Dir != dirs[k%uint64(len(dirs))] || in.LiveCommands != batch {
					t.Fatalf("batch file %+v: want %d commands from %d in %s", in, batch, k*batch+1, dirs[k%uint64(len(dirs))])
				}
				batches++
				continue
			}
			live += in.LiveCommands
			if in.LastIndex != 0 && in.LastIndex <= snap && in.LiveCommands != 0 {
				t.Fatalf("segment %+v: %d live commands, all its entries are at or below %d", in, in.LiveCommands, snap)
			}
		}
		if batches != n || live != uint64(len(all))-snap || logSnap != snap {
			t.Fatalf("Inspect: %d batch files (want %d), %d live commands (want %d), snapshot point %d (want %d)",
				batches, n, live, uint64(len(all))-snap, logSnap, snap)
		}
		// Sealed segments wholly below the snapshot point are gone: per
		// directory, the first segment holding entries reaches past it.
		for _, d := range dirs {
			var segs []SegmentInfo
			for _, in := range infos {
				if in.Dir == d && !in.Compacted && in.LastIndex != 0 {
					segs = append(segs, in)
				}
			}
			if len(segs) > 1 && segs[0].LastIndex <= snap {
				t.Fatalf("%s: sealed segment %s (entries %d..%d) kept below snapshot point %d",
					d, segs[0].Name, segs[0].FirstIndex, segs[0].LastIndex, snap)
			}
		}
	}
	check(l)
	if st := l.Stats(); st.BatchFiles != int(n) || st.BatchesWritten != n || st.BatchCommands != snap ||
		st.SegmentsCompacted != 0 {
		t.Fatalf("Stats = %+v after %d batches of %d", st, n, batch)
	}
	_ = l.Close()
	l, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	check(l)
}

// TestApplySnapshotDropsBatchFiles: a snapshot installed over a log whose
// older entries were compacted into batch files makes those files stand
// for nothing; ApplySnapshot deletes them, as Compact does below its
// point. They were kept until the next Compact, and meanwhile
// CompactedRange reported them, so that as a leader the member refused to
// send incremental snapshots (its newest batch no longer ended at its
// snapshot point), and they held their disk.
func TestApplySnapshotDropsBatchFiles(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("dirs%d", n), func(t *testing.T) {
			fs := vfs.NewMem()
			opts, l, _ := openFilled(t, fs, testDirs(n))
			for {
				ok, err := l.CompactNextBatch(100, 20, keepAll)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
			}
			if _, _, files := l.CompactedRange(); files == 0 {
				t.Fatal("no batch files to start from")
			}
			meta := &raftpb.SnapshotMetadata{Index: proto.Uint64(500), Term: proto.Uint64(2), ConfState: &raftpb.ConfState{}}
			if err := l.ApplySnapshot(meta); err != nil {
				t.Fatal(err)
			}
			check := func(l *Log) {
				t.Helper()
				if first, last, files := l.CompactedRange(); files != 0 {
					t.Fatalf("after a snapshot at 500, %d batch files stand for %d..%d", files, first, last)
				}
				if st := l.Stats(); st.BatchFiles != 0 {
					t.Fatalf("after a snapshot at 500, Stats counts %d batch files", st.BatchFiles)
				}
			}
			check(l)
			check(reopen(t, l, opts))
		})
	}
}
