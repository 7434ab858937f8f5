package raftlog

import (
	"errors"
	"io"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
)

// TestOpenCompactedBatches: the files come oldest first, consecutive, the
// last ending at the snapshot point, with their headers' indexes and term;
// and a file opened before Compact deletes it still reads whole afterwards.
func TestOpenCompactedBatches(t *testing.T) {
	fs := vfs.NewMem()
	dirs := testDirs(1)
	l, err := Open(Options{FS: fs, Dirs: dirs, SegmentSize: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := uint64(0); i < 60; i++ {
		mustAppend(t, l, ents(i*5+1, i*5+5, 2), hs(2, 1, i*5+5))
	}
	for {
		ok, err := l.CompactOldestSegment(200, keepAll)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
	}
	snap, files, err := l.OpenCompactedBatches(0)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseBatchFiles(files)
	if len(files) < 2 {
		t.Fatalf("%d batch files, want several", len(files))
	}
	if first, _ := l.FirstIndex(); snap != first-1 || files[len(files)-1].Last != snap || files[0].First != 1 {
		t.Fatalf("snapshot index %d (first index %d), files %d..%d", snap, first, files[0].First, files[len(files)-1].Last)
	}
	for i, f := range files {
		if f.LastTerm != 2 {
			t.Errorf("file %d: last term %d, want 2", i, f.LastTerm)
		}
		if i > 0 && f.First != files[i-1].Last+1 {
			t.Errorf("file %d starts at %d after one ending at %d", i, f.First, files[i-1].Last)
		}
	}

	// After: only the files ending above it.
	_, later, err := l.OpenCompactedBatches(files[0].Last)
	if err != nil {
		t.Fatal(err)
	}
	if len(later) != len(files)-1 || later[0].First != files[1].First {
		t.Errorf("OpenCompactedBatches(%d) gave %d files, want %d from %d", files[0].Last, len(later), len(files)-1, files[1].First)
	}
	CloseBatchFiles(later)

	// Log truncation deletes every batch file; the open ones still read.
	if err := l.Compact(snap, nil); err != nil && !errors.Is(err, raft.ErrCompacted) {
		t.Fatal(err)
	}
	if st := l.Stats(); st.BatchFiles != 0 {
		t.Fatalf("%d batch files left after Compact(%d)", st.BatchFiles, snap)
	}
	for i, f := range files {
		data, err := io.ReadAll(f.Reader())
		if err != nil {
			t.Fatalf("file %d after deletion: %v", i, err)
		}
		b, err := DecodeCompactedBatch(data)
		if err != nil {
			t.Fatalf("file %d after deletion: %v", i, err)
		}
		if b.FirstIndex != f.First || b.LastIndex != f.Last || int64(len(data)) != f.Size {
			t.Fatalf("file %d reads as %d..%d (%d bytes), header said %d..%d (%d bytes)",
				i, b.FirstIndex, b.LastIndex, len(data), f.First, f.Last, f.Size)
		}
	}
	if _, none, err := l.OpenCompactedBatches(0); err != nil || len(none) != 0 {
		t.Fatalf("OpenCompactedBatches after truncation = %d files, %v", len(none), err)
	}
}
