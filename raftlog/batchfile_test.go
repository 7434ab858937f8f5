package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// sampleBatch stands for entries 10..19: puts superseded within the batch
// are gone (by versions at or below revision 38), a deletion and a conf
// change are kept.
func sampleBatch() *CompactedBatch {
	cc := &raftpb.Entry{Index: proto.Uint64(12), Term: proto.Uint64(3),
		Type: raftpb.EntryType_EntryConfChange.Enum(), Data: []byte("conf change")}
	return &CompactedBatch{
		FirstIndex: 10, LastIndex: 19, LastTerm: 3, Revision: 42, CompactRevision: 38,
		Records: []BatchRecord{
			{Kind: RecordPut, Index: 11, Main: 35, Sub: 1, Key: []byte("a"), Value: []byte("value a"),
				CreateRevision: 20, Version: 4, Lease: 7},
			{Kind: RecordEntry, Index: 12, Entry: cc},
			{Kind: RecordDelete, Index: 15, Main: 38, Key: []byte("b")},
			{Kind: RecordPut, Index: 19, Main: 42, Key: []byte("c\x00d"), Value: nil, CreateRevision: 42, Version: 1},
		},
	}
}

func sameBatch(t *testing.T, got, want *CompactedBatch) {
	t.Helper()
	if got.FirstIndex != want.FirstIndex || got.LastIndex != want.LastIndex || got.LastTerm != want.LastTerm ||
		got.Revision != want.Revision || got.CompactRevision != want.CompactRevision || len(got.Records) != len(want.Records) {
		t.Fatalf("batch %+v, want %+v", got, want)
	}
	for i := range want.Records {
		g, w := got.Records[i], want.Records[i]
		ge, we := g.Entry, w.Entry
		g.Entry, w.Entry = nil, nil
		if len(g.Value) == 0 {
			g.Value = nil
		}
		if len(w.Value) == 0 {
			w.Value = nil
		}
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("record %d: %+v, want %+v", i, g, w)
		}
		if (ge == nil) != (we == nil) || (we != nil && sameEntries([]*raftpb.Entry{ge}, []*raftpb.Entry{we}) != nil) {
			t.Fatalf("record %d: entry %v, want %v", i, ge, we)
		}
	}
}

// sampleBatchV1 is sampleBatch as read from a version 1 file, which does
// not record the compact revision.
func sampleBatchV1() *CompactedBatch {
	b := sampleBatch()
	b.CompactRevision = UnknownCompactRevision
	return b
}

// TestCompactedBatchRoundTrip: a batch survives its encoding, in version 2
// (the compact revision recorded, or none dropped) and in version 1 (a
// batch read from a version 1 file); every damage is ErrCorrupt.
func TestCompactedBatchRoundTrip(t *testing.T) {
	noneDropped := sampleBatch()
	noneDropped.CompactRevision = 0
	for _, tc := range []struct {
		name    string
		batch   *CompactedBatch
		version uint32
	}{
		{name: "version 2", batch: sampleBatch(), version: 2},
		{name: "version 2, nothing dropped", batch: noneDropped, version: 2},
		{name: "version 1", batch: sampleBatchV1(), version: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.batch
			data, err := EncodeCompactedBatch(want)
			if err != nil {
				t.Fatal(err)
			}
			if v := binary.LittleEndian.Uint32(data[8:12]); v != tc.version {
				t.Fatalf("written as version %d, want %d", v, tc.version)
			}
			got, err := DecodeCompactedBatch(data)
			if err != nil {
				t.Fatal(err)
			}
			sameBatch(t, got, want)
			if got.Commands() != 10 {
				t.Fatalf("Commands = %d, want 10", got.Commands())
			}
			// Every single-byte change is detected.
			for i := range data {
				bad := bytes.Clone(data)
				bad[i] ^= 0x40
				if _, err := DecodeCompactedBatch(bad); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("byte %d flipped: %v, want ErrCorrupt", i, err)
				}
			}
			// So is every truncation.
			for n := range len(data) {
				if _, err := DecodeCompactedBatch(data[:n]); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("truncated to %d: %v, want ErrCorrupt", n, err)
				}
			}
		})
	}
}

// TestCompactedBatchSmallestRecords round-trips batches made only of the
// smallest records: the decoder's bound on the record count must admit
// them (a kept entry with no data is 28 bytes, less than a deletion).
func TestCompactedBatchSmallestRecords(t *testing.T) {
	empty := func(i uint64) *raftpb.Entry {
		return &raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(1), Type: raftpb.EntryType_EntryNormal.Enum()}
	}
	for _, c := range []struct {
		name    string
		records []BatchRecord
	}{
		{name: "one empty entry", records: []BatchRecord{{Kind: RecordEntry, Index: 5, Entry: empty(5)}}},
		{name: "empty entries", records: []BatchRecord{
			{Kind: RecordEntry, Index: 5, Entry: empty(5)}, {Kind: RecordEntry, Index: 6, Entry: empty(6)},
			{Kind: RecordEntry, Index: 7, Entry: empty(7)}}},
		{name: "deletion", records: []BatchRecord{{Kind: RecordDelete, Index: 5, Main: 3, Key: []byte("k")}}},
		{name: "put of an empty value", records: []BatchRecord{{Kind: RecordPut, Index: 6, Main: 3, Key: []byte("k"), CreateRevision: 3, Version: 1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := &CompactedBatch{FirstIndex: 5, LastIndex: 7, LastTerm: 1, Revision: 3, Records: c.records}
			data, err := EncodeCompactedBatch(want)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeCompactedBatch(data)
			if err != nil {
				t.Fatal(err)
			}
			sameBatch(t, got, want)
		})
	}
}

func TestEncodeCompactedBatchRejects(t *testing.T) {
	for name, mutate := range map[string]func(b *CompactedBatch){
		"empty range":         func(b *CompactedBatch) { b.LastIndex = b.FirstIndex - 1 },
		"record out of range": func(b *CompactedBatch) { b.Records[0].Index = 30 },
		"records out of order": func(b *CompactedBatch) {
			b.Records[0].Index, b.Records[2].Index = 15, 11
		},
		"unknown kind":                    func(b *CompactedBatch) { b.Records[0].Kind = 9 },
		"entry index wrong":               func(b *CompactedBatch) { b.Records[1].Index = 13 },
		"compact revision above revision": func(b *CompactedBatch) { b.CompactRevision = 43 },
		"negative compact revision":       func(b *CompactedBatch) { b.CompactRevision = -2 },
	} {
		b := sampleBatch()
		mutate(b)
		if _, err := EncodeCompactedBatch(b); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

// TestCompactedBatchFile writes a batch file next to segments and checks
// that Inspect reports it with the commands it stands for and the records
// it holds, and that the log itself still opens.
func TestCompactedBatchFile(t *testing.T) {
	fs := vfs.NewMem()
	l := openLog(t, fs, 0)
	mustAppend(t, l, ents(1, 3, 1), hs(1, 1, 3))
	_ = l.Close()
	name := batchFileName(0, 10)
	if err := WriteCompactedBatch(fs, testDir, name, sampleBatch()); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCompactedBatch(fs, fs.PathJoin(testDir, name))
	if err != nil {
		t.Fatal(err)
	}
	sameBatch(t, got, sampleBatch())
	infos, err := Inspect(fs, []string{testDir})
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || !infos[0].Compacted || infos[0].Commands != 10 || infos[0].Records != 4 ||
		infos[0].FirstIndex != 10 || infos[0].LastIndex != 19 || infos[1].Compacted || infos[1].Commands != 3 {
		t.Fatalf("Inspect = %+v", infos)
	}
	names, _ := fs.List(testDir)
	for _, n := range names {
		if filepath.Ext(n) == tempSuffix {
			t.Fatalf("temporary file %s left behind", n)
		}
	}
}

// TestGoldenCompactedBatch pins the versions of the compacted batch file:
// version 2 (written today) and version 1 (written by older releases;
// still read, its compact revision unknown). The encoder must still
// produce the stored bytes, and the decoder read them.
func TestGoldenCompactedBatch(t *testing.T) {
	for _, tc := range []struct {
		dir   string
		batch *CompactedBatch
	}{
		{dir: "cbatch-v1", batch: sampleBatchV1()},
		{dir: "cbatch-v2", batch: sampleBatch()},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			path := filepath.Join("testdata", tc.dir, batchFileName(3, 10))
			want, err := EncodeCompactedBatch(tc.batch)
			if err != nil {
				t.Fatal(err)
			}
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
				t.Fatalf("the encoder no longer writes %s byte for byte", tc.dir)
			}
			b, err := DecodeCompactedBatch(got)
			if err != nil {
				t.Fatal(err)
			}
			sameBatch(t, b, tc.batch)
		})
	}
}

// FuzzDecodeCompactedBatch: the decoder never panics or over-allocates,
// and whatever it accepts re-encodes to the same bytes.
func FuzzDecodeCompactedBatch(f *testing.F) {
	data, _ := EncodeCompactedBatch(sampleBatch())
	f.Add(data)
	f.Add(data[:batchFileHeaderSize])
	v1, _ := EncodeCompactedBatch(sampleBatchV1())
	f.Add(v1)
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := DecodeCompactedBatch(p)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again, err := EncodeCompactedBatch(b)
		if err != nil {
			t.Fatalf("decoded batch does not encode: %v", err)
		}
		if !bytes.Equal(again, p) {
			t.Fatal("decoded batch re-encodes differently")
		}
	})
}
