package logcompact

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/raftlog"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// sampleBatch stands for entries 10..19: puts superseded within the batch
// are gone (by versions at or below revision 38), a deletion and a kept
// entry remain. The golden files of every version hold it.
func sampleBatch() *Batch {
	cc := &raftpb.Entry{Index: proto.Uint64(12), Term: proto.Uint64(3),
		Type: raftpb.EntryType_EntryConfChange.Enum(), Data: []byte("conf change")}
	return &Batch{
		FirstIndex: 10, LastIndex: 19, LastTerm: 3, Revision: 42, CompactRevision: 38,
		Records: []Record{
			{Kind: RecordPut, Index: 11, Main: 35, Sub: 1, Key: []byte("a"), Value: []byte("value a"),
				CreateRevision: 20, Version: 4, Lease: 7},
			{Kind: RecordEntry, Index: 12, Entry: cc},
			{Kind: RecordDelete, Index: 15, Main: 38, Key: []byte("b")},
			{Kind: RecordPut, Index: 19, Main: 42, Key: []byte("c\x00d"), Value: nil, CreateRevision: 42, Version: 1},
		},
	}
}

func sameBatch(t *testing.T, got, want *Batch) {
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
		if (ge == nil) != (we == nil) || (we != nil && !proto.Equal(ge, we)) {
			t.Fatalf("record %d: entry %v, want %v", i, ge, we)
		}
	}
}

// throughFile is b as the raft log stores it and reads it back.
func throughFile(t *testing.T, b *Batch) (*Batch, []byte) {
	t.Helper()
	file, err := EncodeBatch(b)
	if err != nil {
		t.Fatal(err)
	}
	data, err := raftlog.EncodeCompactedBatch(file)
	if err != nil {
		t.Fatal(err)
	}
	if file, err = raftlog.DecodeCompactedBatch(data); err != nil {
		t.Fatal(err)
	}
	got, err := DecodeBatch(file)
	if err != nil {
		t.Fatal(err)
	}
	return got, data
}

// TestBatchRoundTrip: a batch survives its payload and the log's file, and
// a payload the log hands over intact but that does not decode (damage the
// file's checksum could not see: a bug, or another writer) is ErrCorrupt.
func TestBatchRoundTrip(t *testing.T) {
	noneDropped := sampleBatch()
	noneDropped.CompactRevision = 0
	empty := func(i uint64) *raftpb.Entry {
		return &raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(1), Type: raftpb.EntryType_EntryNormal.Enum()}
	}
	for name, want := range map[string]*Batch{
		"sample":          sampleBatch(),
		"nothing dropped": noneDropped,
		"no records":      {FirstIndex: 5, LastIndex: 7, LastTerm: 1, Revision: 3},
		// The smallest records: the decoder's bound on the record count
		// must admit them.
		"empty entries": {FirstIndex: 5, LastIndex: 7, LastTerm: 1, Revision: 3, Records: []Record{
			{Kind: RecordEntry, Index: 5, Entry: empty(5)}, {Kind: RecordEntry, Index: 6, Entry: empty(6)},
			{Kind: RecordEntry, Index: 7, Entry: empty(7)}}},
		"deletion":              {FirstIndex: 5, LastIndex: 7, LastTerm: 1, Revision: 3, Records: []Record{{Kind: RecordDelete, Index: 5, Main: 3, Key: []byte("k")}}},
		"put of an empty value": {FirstIndex: 5, LastIndex: 7, LastTerm: 1, Revision: 3, Records: []Record{{Kind: RecordPut, Index: 6, Main: 3, Key: []byte("k"), CreateRevision: 3, Version: 1}}},
	} {
		t.Run(name, func(t *testing.T) {
			got, _ := throughFile(t, want)
			sameBatch(t, got, want)
			file, err := EncodeBatch(want)
			if err != nil {
				t.Fatal(err)
			}
			if file.Records != uint64(len(want.Records)) || file.PayloadFormat != payloadFormat {
				t.Fatalf("file says %d records of payload format %d", file.Records, file.PayloadFormat)
			}
			for i := range file.Payload {
				bad := *file
				bad.Payload = bytes.Clone(file.Payload)
				bad.Payload[i] ^= 0xff
				if b, err := DecodeBatch(&bad); err == nil {
					// A flipped value byte still decodes; a structural
					// one must not.
					if len(b.Records) != len(want.Records) {
						t.Fatalf("byte %d flipped: decoded %d records, want %d or an error", i, len(b.Records), len(want.Records))
					}
				} else if !errors.Is(err, ErrCorrupt) || !errors.Is(err, raftlog.ErrCorrupt) {
					t.Fatalf("byte %d flipped: %v, want ErrCorrupt", i, err)
				}
			}
			for n := range len(file.Payload) {
				short := *file
				short.Payload = file.Payload[:n]
				if _, err := DecodeBatch(&short); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("payload cut to %d bytes: %v, want ErrCorrupt", n, err)
				}
			}
			more := *file
			more.Records++
			if _, err := DecodeBatch(&more); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("one record more than the payload holds: %v, want ErrCorrupt", err)
			}
		})
	}
}

func TestEncodeBatchRejects(t *testing.T) {
	for name, mutate := range map[string]func(b *Batch){
		"empty range":         func(b *Batch) { b.LastIndex = b.FirstIndex - 1 },
		"record out of range": func(b *Batch) { b.Records[0].Index = 30 },
		"records out of order": func(b *Batch) {
			b.Records[0].Index, b.Records[2].Index = 15, 11
		},
		"unknown kind":                    func(b *Batch) { b.Records[0].Kind = 9 },
		"entry index wrong":               func(b *Batch) { b.Records[1].Index = 13 },
		"compact revision above revision": func(b *Batch) { b.CompactRevision = 43 },
		"negative compact revision":       func(b *Batch) { b.CompactRevision = -2 },
		"compact revision unknown":        func(b *Batch) { b.CompactRevision = UnknownCompactRevision },
	} {
		b := sampleBatch()
		mutate(b)
		if _, err := EncodeBatch(b); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

// TestGoldenBatch pins the payload formats: format 3 (written today, in a
// batch file of version 3), and the files of versions 1 and 2 that older
// releases wrote, which still read (version 1's compact revision unknown).
// All three hold sampleBatch.
func TestGoldenBatch(t *testing.T) {
	path := func(dir string) string {
		return filepath.Join("testdata", dir, "0000000000000003-000000000000000a.cbatch")
	}
	_, want := throughFile(t, sampleBatch())
	if *update {
		if err := os.MkdirAll(filepath.Dir(path("payload-v3")), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path("payload-v3"), want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	v1 := sampleBatch()
	v1.CompactRevision = UnknownCompactRevision
	for _, tc := range []struct {
		dir   string
		batch *Batch
	}{
		{dir: "cbatch-v1", batch: v1},
		{dir: "cbatch-v2", batch: sampleBatch()},
		{dir: "payload-v3", batch: sampleBatch()},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			data, err := os.ReadFile(path(tc.dir))
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if tc.dir == "payload-v3" && !bytes.Equal(data, want) {
				t.Fatal("the encoder no longer writes payload format 3 byte for byte")
			}
			file, err := raftlog.DecodeCompactedBatch(data)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeBatch(file)
			if err != nil {
				t.Fatal(err)
			}
			sameBatch(t, got, tc.batch)
		})
	}
}

// FuzzDecodeBatch: the payload decoder never panics or over-allocates
// (the payload reached the log through a file or a peer), and what it
// accepts of the current format re-encodes to the same bytes.
func FuzzDecodeBatch(f *testing.F) {
	file, _ := EncodeBatch(sampleBatch())
	f.Add(file.Payload, file.Records, uint32(payloadFormat))
	for v, dir := range []string{"cbatch-v1", "cbatch-v2"} {
		if data, err := os.ReadFile(filepath.Join("testdata", dir, "0000000000000003-000000000000000a.cbatch")); err == nil {
			f.Add(data, uint64(4), uint32(v+1))
		}
	}
	f.Fuzz(func(t *testing.T, payload []byte, records uint64, format uint32) {
		cb := &raftlog.CompactedBatch{FirstIndex: 10, LastIndex: 19, LastTerm: 3, Records: records,
			PayloadFormat: format, Payload: payload}
		b, err := DecodeBatch(cb)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if format != payloadFormat {
			return
		}
		again, err := EncodeBatch(b)
		if err != nil {
			t.Fatalf("decoded batch does not encode: %v", err)
		}
		if !bytes.Equal(again.Payload, payload) || again.Records != records {
			t.Fatalf("decoded batch re-encodes differently: %d records", again.Records)
		}
	})
}
