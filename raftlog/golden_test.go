package raftlog

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// goldenV1 builds, with fixed salts, a two-segment log of format version 1
// that exercises every frame type and flag: a conflict, a HardState-only
// batch, and a log compaction state frame.
func goldenV1(t *testing.T) map[string][]byte {
	t.Helper()
	seg := func(seq, first, salt uint64, frames func(buf []byte) []byte) []byte {
		b := make([]byte, segmentHeaderSize)
		segmentHeader{seq: seq, firstIndex: first, salt: salt}.encode(b)
		return frames(b)
	}
	state := func(buf []byte, salt uint64, st logState) []byte {
		out, err := appendStateFrame(buf, salt, st)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	const salt1, salt2 = 0x1111111111111111, 0x2222222222222222
	return map[string][]byte{
		segmentName(1, 1): seg(1, 1, salt1, func(b []byte) []byte {
			b = state(b, salt1, logState{cs: &raftpb.ConfState{}})
			b = appendBatchFrame(b, salt1, ents(1, 3, 1), true, hardState{1, 1, 2})
			b = appendBatchFrame(b, salt1, ents(3, 4, 2), true, hardState{2, 0, 3})
			return appendBatchFrame(b, salt1, nil, true, hardState{2, 2, 3})
		}),
		segmentName(2, 5): seg(2, 5, salt2, func(b []byte) []byte {
			b = state(b, salt2, logState{hs: hardState{2, 2, 3}, cs: &raftpb.ConfState{}})
			b = appendBatchFrame(b, salt2, ents(5, 6, 2), true, hardState{2, 2, 5})
			return state(b, salt2, logState{snapIndex: 4, snapTerm: 2, hs: hardState{2, 2, 5},
				cs: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}})
		}),
	}
}

// TestGoldenV1 pins format version 1: the encoders must still produce the
// stored bytes, and Open must still read them.
func TestGoldenV1(t *testing.T) {
	dir := filepath.Join("testdata", "v1")
	files := goldenV1(t)
	if *update {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	fs := vfs.NewMem()
	if err := fs.MkdirAll(testDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("%v (run with -update to create)", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: the encoder no longer writes format version 1 byte for byte", name)
		}
		f, _ := fs.Create(fs.PathJoin(testDir, name), vfs.WriteCategoryUnspecified)
		_, _ = f.Write(got)
		_ = f.Close()
	}
	l := openLog(t, fs, 0)
	defer l.Close()
	checkLog(t, l, 4, 2, ents(5, 6, 2), hardState{2, 2, 5})
	_, cs, _ := l.InitialState()
	if !sameConfState(cs, &raftpb.ConfState{Voters: []uint64{1, 2, 3}}) {
		t.Fatalf("ConfState %v", cs)
	}
}
