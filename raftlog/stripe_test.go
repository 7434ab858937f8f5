package raftlog

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/protobuf/proto"
)

func TestSplitParts(t *testing.T) {
	sized := func(sizes ...int) []*raftpb.Entry {
		var out []*raftpb.Entry
		for i, n := range sizes {
			e := ent(uint64(i+1), 1)
			e.Data = make([]byte, n)
			out = append(out, e)
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		sizes    []int
		lanes    int
		minBytes int
		want     []int // entries per part
	}{
		{"none", nil, 3, 0, []int{0}},
		{"one entry", []int{10}, 3, 0, []int{1}},
		{"one lane", []int{10, 10, 10}, 1, 0, []int{3}},
		{"even", []int{10, 10, 10, 10}, 2, 0, []int{2, 2}},
		{"fewer entries than lanes", []int{10, 10}, 3, 0, []int{1, 1}},
		{"one big entry first", []int{1000, 1, 1, 1}, 2, 0, []int{1, 3}},
		{"one big entry last", []int{1, 1, 1, 1000}, 2, 0, []int{3, 1}},
		{"every lane gets one", []int{1, 1, 1, 1000}, 4, 0, []int{1, 1, 1, 1}},
		{"below the stripe size", []int{10, 10, 10, 10}, 2, 1000, []int{4}},
		{"at the stripe size", []int{10, 10, 10, 10}, 2, 4 * (entryFixedSize + 10), []int{2, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			entries := sized(tc.sizes...)
			parts := splitParts(entries, tc.lanes, tc.minBytes)
			var got []int
			var joined []*raftpb.Entry
			for _, p := range parts {
				got = append(got, len(p))
				joined = append(joined, p...)
			}
			if !equalInts(got, tc.want) {
				t.Fatalf("part sizes %v, want %v", got, tc.want)
			}
			if err := sameEntries(joined, entries); err != nil {
				t.Fatalf("parts do not join to the input: %v", err)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStripedTornPart loses one part of the last Append in each directory
// in turn (as a power cut before its fdatasync would): recovery must drop
// the parts that did reach the other directories, keep every earlier
// Append, and accept new appends that survive another reopen.
func TestStripedTornPart(t *testing.T) {
	dirs := testDirs(3)
	for lost := range dirs {
		t.Run(dirs[lost], func(t *testing.T) {
			fs := vfs.NewMem()
			opts := Options{FS: fs, Dirs: dirs, SegmentSize: 64 << 10, MinStripeBytes: -1}
			l, err := Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			mustAppend(t, l, ents(1, 6, 1), hs(1, 1, 3))
			mustAppend(t, l, ents(7, 9, 1), hs(1, 1, 6))
			_ = l.Close()
			// Zero the last frame of the lost directory's segment.
			names, _, err := listSegments(fs, dirs[lost])
			if err != nil || len(names) != 1 {
				t.Fatalf("segments %v, %v", names, err)
			}
			offs := frameOffsetsIn(t, fs, dirs[lost], names[0])
			f, err := fs.OpenReadWrite(fs.PathJoin(dirs[lost], names[0]), vfs.WriteCategoryUnspecified)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = f.WriteAt(make([]byte, 64), offs[len(offs)-1])
			_ = f.Close()

			l, logs, err := openObservedDirs(t, fs, opts)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			checkLog(t, l, 0, 0, ents(1, 6, 1), hardState{1, 1, 3})
			if logs.Len() == 0 {
				t.Errorf("no warning about the torn write")
			}
			mustAppend(t, l, ents(7, 12, 2), hs(2, 1, 8))
			_ = l.Close()
			l, err = Open(opts)
			if err != nil {
				t.Fatalf("reopen: %v", err)
			}
			checkLog(t, l, 0, 0, append(ents(1, 6, 1), ents(7, 12, 2)...), hardState{2, 1, 8})
			_ = l.Close()
		})
	}
}

// TestDirCountChangeRefused: a log written with one directory cannot be
// opened with two, nor the other way round; frames would be misordered.
func TestDirCountChangeRefused(t *testing.T) {
	for _, tc := range []struct{ write, open int }{{1, 2}, {2, 1}} {
		fs := vfs.NewMem()
		l, err := Open(Options{FS: fs, Dirs: testDirs(tc.write), SegmentSize: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		mustAppend(t, l, ents(1, 4, 1), hs(1, 1, 4))
		_ = l.Close()
		if _, err := Open(Options{FS: fs, Dirs: testDirs(tc.open), SegmentSize: 64 << 10}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("written with %d dirs, opened with %d: %v, want ErrCorrupt", tc.write, tc.open, err)
		}
	}
}

// TestStripedAppendsSpreadAcrossDirs checks that a striped Append writes
// to every directory, and that Inspect sees all the entries.
func TestStripedAppendsSpreadAcrossDirs(t *testing.T) {
	fs := vfs.NewMem()
	dirs := testDirs(2)
	l, err := Open(Options{FS: fs, Dirs: dirs, SegmentSize: 64 << 10, MinStripeBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); i < 10; i++ {
		mustAppend(t, l, ents(i*4+1, i*4+4, 1), hs(1, 1, i*4+4))
	}
	_ = l.Close()
	infos, err := Inspect(fs, dirs)
	if err != nil {
		t.Fatal(err)
	}
	var total uint64
	perDir := map[string]uint64{}
	for _, in := range infos {
		total += in.Commands
		perDir[in.Dir] += in.Commands
	}
	// Parts are split by bytes and entry sizes differ a little.
	if total != 40 || perDir[dirs[0]] < 15 || perDir[dirs[1]] < 15 {
		t.Fatalf("entries per dir %v (total %d), want about 20 each", perDir, total)
	}
}

// goldenV2 builds, with fixed salts, a two-directory log of format
// version 2: opening state frames, an Append split in two parts, a
// HardState-only Append and a log compaction state.
func goldenV2(t *testing.T) map[string][]byte {
	t.Helper()
	seg := func(seq, first, salt uint64, frames func(buf []byte) []byte) []byte {
		b := make([]byte, segmentHeaderSize)
		segmentHeader{version: formatVersionStriped, seq: seq, firstIndex: first, salt: salt}.encode(b)
		return frames(b)
	}
	state := func(buf []byte, salt uint64, sp stripe, st logState) []byte {
		n, fill, err := statePayload(st)
		if err != nil {
			t.Fatal(err)
		}
		return appendStripeFrame(buf, salt, sp, frameState, n, fill)
	}
	batchPart := func(buf []byte, salt uint64, sp stripe, e []*raftpb.Entry, withHS bool, h hardState) []byte {
		return appendStripeFrame(buf, salt, sp, frameBatch, batchPayloadSize(e, withHS), batchFill(e, withHS, h))
	}
	const salt1, salt2 = 0x1111111111111111, 0x2222222222222222
	empty := logState{cs: &raftpb.ConfState{}}
	return map[string][]byte{
		"wal/" + segmentName(1, 1): seg(1, 1, salt1, func(b []byte) []byte {
			b = state(b, salt1, stripe{op: 1}, empty)
			b = batchPart(b, salt1, stripe{op: 1, part: 0, parts: 2}, ents(1, 2, 1), true, hardState{1, 1, 2})
			b = batchPart(b, salt1, stripe{op: 2, part: 0, parts: 1}, nil, true, hardState{1, 1, 4})
			return state(b, salt1, stripe{op: 3, part: 0, parts: 1}, logState{snapIndex: 2, snapTerm: 1,
				hs: hardState{1, 1, 4}, cs: &raftpb.ConfState{Voters: []uint64{1}}})
		}),
		"wal1/" + segmentName(2, 1): seg(2, 1, salt2, func(b []byte) []byte {
			b = state(b, salt2, stripe{op: 1}, empty)
			return batchPart(b, salt2, stripe{op: 1, part: 1, parts: 2}, ents(3, 4, 1), false, hardState{})
		}),
	}
}

// TestGoldenV2 pins format version 2 (several directories).
func TestGoldenV2(t *testing.T) {
	dir := filepath.Join("testdata", "v2")
	files := goldenV2(t)
	fs := vfs.NewMem()
	for name, want := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if *update {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run with -update to create)", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: the encoder no longer writes format version 2 byte for byte", name)
		}
		if err := fs.MkdirAll(fs.PathDir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		f, _ := fs.Create(name, vfs.WriteCategoryUnspecified)
		_, _ = f.Write(got)
		_ = f.Close()
	}
	l, err := Open(Options{FS: fs, Dirs: testDirs(2), SegmentSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	checkLog(t, l, 2, 1, ents(3, 4, 1), hardState{1, 1, 4})
	_, cs, _ := l.InitialState()
	if !sameConfState(cs, &raftpb.ConfState{Voters: []uint64{1}}) {
		t.Fatalf("ConfState %v", cs)
	}
}

// frameOffsetsIn lists the frame offsets of segment name in dir.
func frameOffsetsIn(t *testing.T, fs vfs.FS, dir, name string) []int64 {
	t.Helper()
	f, err := fs.Open(fs.PathJoin(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var offs []int64
	if _, err := scanSegment(f, name, true, func(off int64, _ byte, _ []byte) error {
		offs = append(offs, off)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return offs
}

// openObservedDirs opens with opts and a logger whose output the test can
// read.
func openObservedDirs(t testing.TB, fs vfs.FS, opts Options) (*Log, *observer.ObservedLogs, error) {
	t.Helper()
	core, logs := observer.New(zap.WarnLevel)
	opts.FS, opts.Logger = fs, zap.New(core)
	l, err := Open(opts)
	return l, logs, err
}

// FuzzDecodeStripe: the stripe prefix decoder never panics, and what it
// accepts re-encodes to the same bytes.
func FuzzDecodeStripe(f *testing.F) {
	f.Add(appendStripeFrame(nil, 1, stripe{op: 7, part: 1, parts: 2}, frameBatch, 8, func(p []byte) {})[frameHeaderSize:])
	f.Add(make([]byte, stripeHeaderSize))
	f.Fuzz(func(t *testing.T, p []byte) {
		sp, inner, body, err := decodeStripe(p)
		if err != nil {
			return
		}
		again := appendStripeFrame(nil, 1, sp, inner, len(body), func(q []byte) { copy(q, body) })
		if got := again[frameHeaderSize : frameHeaderSize+len(p)]; !bytes.Equal(got, p) {
			t.Fatalf("stripe %+v re-encodes to %x, was %x", sp, got, p)
		}
	})
}

// TestStripedCompactionKeepsOverwrite: with several directories, an Append
// that overwrote a suffix (a new leader replacing uncommitted entries) may
// sit in one directory and the entries it replaced in another. Log
// compaction must not delete the overwrite's segment while the replaced
// entries' segment stays: replay would bring them back after the snapshot
// point. Per-directory oldest-first deletion did, and the reopened log
// ended at 25 with term 5 entries raft had truncated.
func TestStripedCompactionKeepsOverwrite(t *testing.T) {
	fs := vfs.NewMem()
	// Appends go whole to one directory, the directories taking turns by
	// the write's number: writes 1, 3, 5 to wal1, 2, 4, 6 to wal.
	opts := Options{FS: fs, Dirs: testDirs(2), SegmentSize: 64 << 10, MinStripeBytes: 1 << 30}
	l, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, ents(1, 20, 1), hs(1, 1, 20))  // write 1, wal1
	mustAppend(t, l, ents(21, 25, 5), hs(5, 1, 20)) // write 2, wal: an old leader's uncommitted tail
	// Write 3, wal1: the new leader's entries from 21 on. One entry larger
	// than a segment gets a segment of its own, which the next write to
	// wal1 seals.
	big := ent(21, 6)
	big.Data = make([]byte, 80<<10)
	mustAppend(t, l, []*raftpb.Entry{big, ent(22, 6)}, hs(6, 1, 22))
	mustAppend(t, l, nil, hs(6, 1, 22)) // write 4, wal
	mustAppend(t, l, nil, hs(6, 2, 22)) // write 5, wal1: seals write 3's segment
	if err := l.Compact(22, nil); err != nil {
		t.Fatal(err)
	}
	l = reopen(t, l, opts)
	if last, err := l.LastIndex(); err != nil || last != 22 {
		t.Fatalf("after compaction to 22 and a reopen, LastIndex = %d, %v; want 22 (the overwritten 23..25 came back)", last, err)
	}
}

// TestStripedCompactionKeepsReset: the same for a snapshot installed over
// uncommitted entries: the segment opening with ApplySnapshot's reset must
// outlive the older entries kept in another directory, or replay brings
// them back after the snapshot point.
func TestStripedCompactionKeepsReset(t *testing.T) {
	fs := vfs.NewMem()
	opts := Options{FS: fs, Dirs: testDirs(2), SegmentSize: 64 << 10, MinStripeBytes: 1 << 30}
	l, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, ents(1, 10, 1), hs(1, 1, 10))  // write 1, wal1
	mustAppend(t, l, ents(11, 20, 1), hs(1, 1, 20)) // write 2, wal
	mustAppend(t, l, ents(21, 60, 2), hs(2, 1, 20)) // write 3, wal1: uncommitted
	// Write 4, wal: a snapshot at 40 of another history replaces them all.
	meta := &raftpb.SnapshotMetadata{Index: proto.Uint64(40), Term: proto.Uint64(3), ConfState: &raftpb.ConfState{}}
	if err := l.ApplySnapshot(meta); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, l, nil, hs(3, 2, 40)) // write 5, wal1
	// Write 6, wal: 41..45 in the reset's segment, overfilling it, so
	// that write 7 to wal seals it.
	more := ents(41, 45, 3)
	more[0].Data = make([]byte, 80<<10)
	mustAppend(t, l, more, hs(3, 2, 45))
	mustAppend(t, l, nil, hs(3, 2, 45)) // write 7, wal1
	mustAppend(t, l, nil, hs(3, 3, 45)) // write 8, wal: seals the reset's segment
	if err := l.Compact(45, nil); err != nil {
		t.Fatal(err)
	}
	l = reopen(t, l, opts)
	if last, err := l.LastIndex(); err != nil || last != 45 {
		t.Fatalf("after compaction to 45 and a reopen, LastIndex = %d, %v; want 45 (entries replaced by the snapshot came back)", last, err)
	}
}

// TestStripedAppendWithinFrameLimit: in a log with several directories a
// frame carries a 16-byte stripe header besides the batch, and recovery
// takes a frame above MaxFrameSize for a torn one. An Append whose batch
// fits MaxFrameSize but not with the header was written, acknowledged,
// and then zeroed as a torn tail at the next Open; it is refused instead.
func TestStripedAppendWithinFrameLimit(t *testing.T) {
	l, err := Open(Options{FS: vfs.NewMem(), Dirs: testDirs(2), SegmentSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	e := ent(1, 1)
	e.Data = make([]byte, MaxFrameSize-batchPayloadSize([]*raftpb.Entry{ent(1, 1)}, true)+len(e.Data)-8)
	if size := batchPayloadSize([]*raftpb.Entry{e}, true); size+stripeHeaderSize <= MaxFrameSize || size > MaxFrameSize {
		t.Fatalf("the test's batch is %d bytes; want within %d of MaxFrameSize", size, stripeHeaderSize)
	}
	if err := l.Append([]*raftpb.Entry{e}, hs(1, 1, 0)); err == nil {
		t.Fatal("an Append whose stripe frame exceeds MaxFrameSize was accepted")
	}
	mustAppend(t, l, ents(1, 3, 1), hs(1, 1, 3)) // the log still takes writes
}
